import { Schema } from "effect"
import { Routing, Svc } from "./Chat.ts"

/** The images wire (OpenAI's `POST /v1/images/generations`): what callers send, what providers answer. */

export const IMAGE_SIZES = ["256x256", "512x512", "1024x1024"] as const
export type ImageSize = (typeof IMAGE_SIZES)[number]
export const DEFAULT_IMAGE_SIZE: ImageSize = "256x256"
export const isImageSize = (value: string): value is ImageSize =>
  (IMAGE_SIZES as ReadonlyArray<string>).includes(value)

/** The OpenAI images request, plus the router's `routing`; unknown fields are ignored. */
export const ImageGenerationRequest = Schema.Struct({
  prompt: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(32_000)),
  model: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1))),
  n: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  size: Schema.optionalKey(Schema.NullOr(Schema.String)),
  response_format: Schema.optionalKey(Schema.NullOr(Schema.String)),
  quality: Schema.optionalKey(Schema.NullOr(Schema.String)),
  style: Schema.optionalKey(Schema.NullOr(Schema.String)),
  user: Schema.optionalKey(Schema.String),
  routing: Schema.optionalKey(Routing),
  context: Schema.optionalKey(Schema.Unknown)
})
export type ImageGenerationRequest = typeof ImageGenerationRequest.Type

export const GeneratedImage = Schema.Struct({
  b64_json: Schema.String,
  revised_prompt: Schema.optionalKey(Schema.NullOr(Schema.String))
})

/** An images response: what a provider answers, and (with the router's `svc`) what the caller gets. */
export const ImagesResponse = Schema.Struct({
  created: Schema.Int,
  data: Schema.Array(GeneratedImage).check(Schema.isMinLength(1))
})
export type ImagesResponse = typeof ImagesResponse.Type

/** What the router answers: the images response plus its `svc` object (the auction, the charge). */
export const ImagesReply = Schema.Struct({ ...ImagesResponse.fields, svc: Svc })
