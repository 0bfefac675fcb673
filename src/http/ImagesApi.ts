import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { ImageGenerationRequest, ImagesReply } from "../domain/Images.ts"
import { PaidCallErrors } from "./ChatApi.ts"

/** Image generation: x402 `exact` or a funded key, one image per request, priced up front. */
export class ImagesApi extends HttpApiGroup.make("images").add(
  HttpApiEndpoint.post("generateImage", "/v1/images/generations", {
    payload: ImageGenerationRequest,
    // OpenAI's images response plus the `svc` object.
    success: ImagesReply,
    error: PaidCallErrors
  })
) {}
