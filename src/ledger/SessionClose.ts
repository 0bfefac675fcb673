import { Effect, Schema } from "effect"
import type { SqlClient } from "effect/sql"

const Closed = Schema.Struct({
  payer: Schema.String,
  funding_kind: Schema.Literals(["x402", "credit"]),
  funding_request_id: Schema.String,
  key_id: Schema.NullOr(Schema.String),
  budget: Schema.NumberFromString,
  spent: Schema.NumberFromString
})
const decodeClosed = Schema.decodeUnknownEffect(Schema.Array(Closed))

/**
 * Closing a session settles the remainder by the same rules as any overage: an x402-funded budget
 * becomes a refund of the opening request, paid at epoch close (on chain at or above the payout
 * floor, else credited to the balance); a key-funded budget returns to the key and the owner's
 * balance at once. One transaction; false when the session was not open and idle.
 */
export const makeSessionClose =
  (sql: SqlClient.SqlClient) => (sessionId: string, onlyExpired: boolean, epochId: number) =>
    sql
      .withTransaction(
        Effect.gen(function* () {
          const rows = yield* sql`
            UPDATE sessions SET status = 'closed', closed_at = now()
            WHERE session_id = ${sessionId} AND status = 'open' AND in_flight IS NULL
              AND (${onlyExpired}::boolean = false OR expires_at <= now())
            RETURNING payer, funding_kind, funding_request_id, key_id, budget::text, spent::text
          `.pipe(Effect.flatMap(decodeClosed))
          const row = rows[0]
          if (row === undefined) return false
          const unspent = row.budget - row.spent
          if (row.funding_kind === "credit" && row.key_id !== null) {
            yield* sql`UPDATE api_keys SET reserved = reserved - ${row.budget}, spent = spent + ${row.spent}
                       WHERE key_id = ${row.key_id}`
            yield* sql`UPDATE wallet_balances SET reserved = reserved - ${row.budget},
                       available = available + ${unspent}, updated_at = now() WHERE wallet = ${row.payer}`
            yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                       VALUES (${row.funding_request_id}, ${row.payer}, 'session_released', ${unspent}, ${sessionId})`
            yield* sql`UPDATE sessions SET refund_ref = ${"balance"} WHERE session_id = ${sessionId}`
          } else if (unspent > 0) {
            yield* sql`INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
                       VALUES (${row.funding_request_id}, ${row.payer}, ${unspent}, ${epochId}, 'due')`
            yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                       VALUES (${row.funding_request_id}, ${row.payer}, 'refund_due', ${unspent}, ${sessionId})`
          }
          return true
        })
      )
      .pipe(Effect.orDie, Effect.withSpan("Ledger.closeSession"))
