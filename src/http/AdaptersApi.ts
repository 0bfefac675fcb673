import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
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
import { CountTokensRequest, MessagesRequest } from "../domain/Messages.ts"
import { ResponsesRequest } from "../domain/Responses.ts"
import { PaidCallErrors } from "./ChatApi.ts"
import { anthropic, PaymentRequiredWire } from "./ErrorWire.ts"

/** The harness adapters: same auction, payment and metering as chat completions, other wire shapes. */
export class ResponsesApi extends HttpApiGroup.make("responses").add(
  HttpApiEndpoint.post("createResponse", "/v1/responses", {
    payload: ResponsesRequest,
    // A Responses object, or with `stream: true` the Responses event stream.
    success: Schema.Unknown,
    error: PaidCallErrors
  })
) {}

/** Every way a paid messages call can fail, in Anthropic's convention (402: x402, as everywhere). */
export const MessagesCallErrors = [
  anthropic(InvalidRequest),
  anthropic(Unauthorized),
  anthropic(Forbidden),
  anthropic(CapabilityUnsupported),
  anthropic(FeatureGated),
  anthropic(NotFound),
  anthropic(Conflict),
  anthropic(ServiceUnavailable),
  anthropic(UpstreamFailed),
  PaymentRequiredWire
] as const

export class MessagesApi extends HttpApiGroup.make("messages").add(
  HttpApiEndpoint.post("createMessage", "/v1/messages", {
    payload: MessagesRequest,
    // A Messages object, or with `stream: true` the Messages event stream.
    success: Schema.Unknown,
    error: MessagesCallErrors
  }),
  HttpApiEndpoint.post("countTokens", "/v1/messages/count_tokens", {
    payload: CountTokensRequest,
    success: Schema.Struct({ input_tokens: Schema.Int }),
    error: [anthropic(InvalidRequest), anthropic(CapabilityUnsupported)]
  })
) {}
