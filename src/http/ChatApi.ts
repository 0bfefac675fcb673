import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { ChatCompletionRequest } from "../domain/Chat.ts"
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
      // A chat completion (spec 2.3) or, with `stream: true`, SSE chunks (spec 2.4).
      success: Schema.Unknown,
      error: PaidCallErrors
    })
  )
  .add(
    HttpApiEndpoint.get("resumeStream", "/v1/streams/:id", {
      params: { id: Schema.String },
      success: Schema.Unknown,
      error: [openAi(NotFound), openAi(Unauthorized)]
    }),
    HttpApiEndpoint.post("stopStream", "/v1/streams/:id/stop", {
      params: { id: Schema.String },
      success: Schema.Struct({ id: Schema.String, stopped: Schema.Boolean }),
      error: [openAi(NotFound), openAi(Unauthorized)]
    })
  ) {}

/** How a receipt is in its epoch's root anchored on chain (docs/protocol.md section 3); null until then. */
export const ReceiptInclusion = Schema.Struct({
  epoch_id: Schema.Int,
  leaf: Schema.String,
  proof: Schema.Array(Schema.String),
  root: Schema.String,
  anchor_tx: Schema.String,
  anchor_contract: Schema.String,
  chain_id: Schema.Int
})

export class ReceiptsApi extends HttpApiGroup.make("receipts").add(
  HttpApiEndpoint.get("receipt", "/v1/receipts/:id", {
    params: { id: Schema.String },
    success: Schema.Struct({
      receipt: Schema.Unknown,
      final: Schema.Boolean,
      signature: Schema.NullOr(Schema.String),
      signer: Schema.String,
      typed_data: Schema.Unknown,
      inclusion: Schema.NullOr(ReceiptInclusion)
    }),
    error: openAi(NotFound)
  }),
  HttpApiEndpoint.get("economics", "/v1/analytics/requests/:id", {
    params: { id: Schema.String },
    success: Schema.Unknown,
    error: openAi(NotFound)
  })
) {}
