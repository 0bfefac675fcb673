import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { SessionTape } from "../domain/Analytics.ts"
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
    success: SessionTape,
    error: openAi(NotFound)
  })
) {}
