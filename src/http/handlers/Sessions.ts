import { Effect, Schema } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { SqlClient } from "effect/sql"
import { charge } from "../../domain/Billing.ts"
import { NotFound } from "../../domain/Errors.ts"
import { ReceiptBody } from "../../domain/Receipt.ts"
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

const TapeRow = Schema.Struct({
  request_id: Schema.String,
  status: Schema.String,
  body: Schema.NullOr(ReceiptBody),
  price_setter: Schema.NullOr(Schema.String)
})
const decodeTape = Schema.decodeUnknownEffect(Schema.Array(TapeRow))

export const SessionHandlers = HttpApiBuilder.group(
  Api,
  "sessions",
  Effect.fn(function* (handlers) {
    const sessions = yield* Sessions
    const sql = yield* SqlClient.SqlClient
    return handlers
      .handle("session", ({ params, request }) =>
        Effect.map(sessions.authorize(params.id, request.headers["x-session-token"]), view)
      )
      .handle("closeSession", ({ params, request }) =>
        Effect.map(sessions.close(params.id, request.headers["x-session-token"]), view)
      )
      .handle("sessionTape", ({ params }) =>
        Effect.gen(function* () {
          const session = yield* sessions.find(params.id)
          if (session === undefined) {
            return yield* new NotFound({ code: "session_not_found", message: `No session ${params.id}` })
          }
          const rows = yield* sql`
            SELECT r.request_id, r.status, rc.body, e.body ->> 'price_setter' AS price_setter
            FROM requests r
            LEFT JOIN receipts rc ON rc.request_id = r.request_id
            LEFT JOIN economics e ON e.request_id = r.request_id
            WHERE r.session_id = ${params.id} ORDER BY r.created_at
          `.pipe(Effect.flatMap(decodeTape), Effect.orDie)
          const turns = rows.flatMap((row, i) => {
            const receipt = row.body
            if (receipt === null) return []
            const uncached = charge(
              { input: receipt.in_tokens, cachedInput: 0, output: receipt.out_tokens },
              { price_in: receipt.price_in, price_out: receipt.price_out }
            )
            return [
              {
                turn: i + 1,
                request_id: row.request_id,
                created_at: receipt.created_at,
                status: receipt.status,
                in_tokens: receipt.in_tokens,
                cached_tokens: receipt.cached_tokens,
                out_tokens: receipt.out_tokens,
                charged: receipt.charged,
                cache_discount: Math.max(0, uncached - receipt.charged),
                price_setter: row.price_setter
              }
            ]
          })
          return {
            session_id: session.session_id,
            model_class: session.model_class,
            turns,
            cache_discount_total: turns.reduce((n, t) => n + t.cache_discount, 0),
            charged_total: turns.reduce((n, t) => n + t.charged, 0)
          }
        })
      )
  })
)
