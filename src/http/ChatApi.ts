import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "effect/http-api"
import { ChatCompletion, ChatCompletionRequest } from "../domain/Chat.ts"
import { EconomicsRecord } from "../domain/Economics.ts"
import {
  CapabilityUnsupported,
  Conflict,
  FeatureGated,
  Forbidden,
  InvalidRequest,
  NotFound,
  ServiceUnavailable,
  Unauthorized,
  UpstreamFailed
} from "../domain/Errors.ts"
import { ReceiptReply } from "../domain/Receipt.ts"
import { openAi, PaymentRequiredWire } from "./ErrorWire.ts"

/** Every way a paid chat call can fail, each with its status, in OpenAI's convention (402: x402). */
export const PaidCallErrors = [
  openAi(InvalidRequest),
  openAi(Unauthorized),
  openAi(Forbidden),
  openAi(CapabilityUnsupported),
  openAi(FeatureGated),
  openAi(NotFound),
  openAi(Conflict),
  openAi(ServiceUnavailable),
  openAi(UpstreamFailed),
  PaymentRequiredWire
] as const

export class ChatApi extends HttpApiGroup.make("chat")
  .add(
    HttpApiEndpoint.post("chatCompletions", "/v1/chat/completions", {
      payload: ChatCompletionRequest,
      success: ChatCompletion,
      error: PaidCallErrors
    }).annotate(
      OpenApi.Description,
      "A chat completion (spec 2.3). With `stream: true` the reply is `text/event-stream`: an `auction_cleared` chunk, then `chat.completion.chunk` frames (the ChatCompletionChunk schema), a usage chunk and `data: [DONE]` (spec 2.4)."
    )
  )
  .add(
    HttpApiEndpoint.get("resumeStream", "/v1/streams/:id", {
      params: { id: Schema.String },
      success: Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/event-stream" })),
      error: [openAi(NotFound), openAi(Unauthorized)]
    }).annotate(
      OpenApi.Description,
      "Reconnects to a live or recent stream (`x-stream-token`) after `Last-Event-ID`, in the dialect it was asked in."
    ),
    HttpApiEndpoint.post("stopStream", "/v1/streams/:id/stop", {
      params: { id: Schema.String },
      success: Schema.Struct({ id: Schema.String, stopped: Schema.Boolean }),
      error: [openAi(NotFound), openAi(Unauthorized)]
    })
  ) {}

export class ReceiptsApi extends HttpApiGroup.make("receipts").add(
  HttpApiEndpoint.get("receipt", "/v1/receipts/:id", {
    params: { id: Schema.String },
    success: ReceiptReply,
    error: openAi(NotFound)
  }),
  HttpApiEndpoint.get("economics", "/v1/analytics/requests/:id", {
    params: { id: Schema.String },
    success: EconomicsRecord,
    error: openAi(NotFound)
  })
) {}
