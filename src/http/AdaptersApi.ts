import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, OpenApi } from "effect/http-api"
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
import { CountTokensRequest, Message, MessagesRequest } from "../domain/Messages.ts"
import { ResponseObject, ResponsesRequest } from "../domain/Responses.ts"
import { PaidCallErrors } from "./ChatApi.ts"
import { anthropic, PaymentRequiredWire } from "./ErrorWire.ts"

/** The harness adapters: same auction, payment and metering as chat completions, other wire shapes. */
export class ResponsesApi extends HttpApiGroup.make("responses").add(
  HttpApiEndpoint.post("createResponse", "/v1/responses", {
    payload: ResponsesRequest,
    success: ResponseObject,
    error: PaidCallErrors
  }).annotate(
    OpenApi.Description,
    "A response object. With `stream: true` the reply is `text/event-stream`: the Responses event stream, whose `response.completed` carries the same object."
  )
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
    success: Message,
    error: MessagesCallErrors
  }).annotate(
    OpenApi.Description,
    "A message. With `stream: true` the reply is `text/event-stream`: the Messages event stream (the MessagesStreamEvent schema), preceded by an `svc.auction_cleared` event."
  ),
  HttpApiEndpoint.post("countTokens", "/v1/messages/count_tokens", {
    payload: CountTokensRequest,
    success: Schema.Struct({ input_tokens: Schema.Int }),
    error: [anthropic(InvalidRequest), anthropic(CapabilityUnsupported)]
  })
) {}
