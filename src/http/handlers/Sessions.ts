import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { type SessionRow, Sessions } from "../../payment/Sessions.ts"
import { Api } from "../Api.ts"

const view = (row: SessionRow) => ({
  session_id: row.session_id,
  status: row.status,
  funding: row.funding_kind,
  budget: row.budget,
  spent: row.spent,
  remaining: row.budget - row.spent,
  turns: row.turns,
  model_class: row.model_class,
  tariff: { price_in: row.price_in, price_out: row.price_out, price_in_cached: row.price_in_cached },
  expires_at: row.expires_at,
  refund_ref: row.refund_ref
})

export const SessionHandlers = HttpApiBuilder.group(
  Api,
  "sessions",
  Effect.fn(function* (handlers) {
    const sessions = yield* Sessions
    return handlers
      .handle("session", ({ params, request }) =>
        Effect.map(sessions.authorize(params.id, request.headers["x-session-token"]), view)
      )
      .handle("closeSession", ({ params, request }) =>
        Effect.map(sessions.close(params.id, request.headers["x-session-token"]), view)
      )
      .handle("sessionTape", ({ params }) => sessions.tape(params.id))
  })
)
