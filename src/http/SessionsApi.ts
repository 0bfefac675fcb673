import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { Conflict, NotFound, Unauthorized } from "../domain/Errors.ts"
import { openAi } from "./ErrorWire.ts"

export const SessionView = Schema.Struct({
  session_id: Schema.String,
  status: Schema.String,
  funding: Schema.String,
  budget: Schema.Number,
  spent: Schema.Number,
  remaining: Schema.Number,
  turns: Schema.Number,
  model_class: Schema.String,
  tariff: Schema.Struct({
    price_in: Schema.Number,
    price_out: Schema.Number,
    price_in_cached: Schema.NullOr(Schema.Number)
  }),
  expires_at: Schema.Number,
  refund_ref: Schema.NullOr(Schema.String)
})

export const SessionTurn = Schema.Struct({
  turn: Schema.Number,
  request_id: Schema.String,
  created_at: Schema.Number,
  status: Schema.String,
  in_tokens: Schema.Number,
  cached_tokens: Schema.Number,
  out_tokens: Schema.Number,
  charged: Schema.Number,
  /** What the same tokens would have cost with no cached prefix, minus what was charged. */
  cache_discount: Schema.Number,
  price_setter: Schema.NullOr(Schema.String)
})

export class SessionsApi extends HttpApiGroup.make("sessions").add(
  HttpApiEndpoint.get("session", "/v1/sessions/:id", {
    params: { id: Schema.String },
    success: SessionView,
    error: [openAi(NotFound), openAi(Unauthorized)]
  }),
  HttpApiEndpoint.post("closeSession", "/v1/sessions/:id/close", {
    params: { id: Schema.String },
    success: SessionView,
    error: [openAi(NotFound), openAi(Unauthorized), openAi(Conflict)]
  }),
  HttpApiEndpoint.get("sessionTape", "/v1/analytics/sessions/:id", {
    params: { id: Schema.String },
    success: Schema.Struct({
      session_id: Schema.String,
      model_class: Schema.String,
      turns: Schema.Array(SessionTurn),
      cache_discount_total: Schema.Number,
      charged_total: Schema.Number
    }),
    error: openAi(NotFound)
  })
) {}
