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
 * balance through the credit fold (D402): the opening request joins `credit_unfolded` with the budget
 * as authorized and the session's spending as charged, as a key's capture does (`Capture.ts`), and
 * `queued` wakes the fold's passes. The close locks neither the key's row nor the balance's, so it can
 * never meet the fold (or a reservation) in a deadlock; readers count the queue (D316) and see the
 * close at once. One transaction; false when the session was not open and idle.
 */
export const makeSessionClose =
  (sql: SqlClient.SqlClient, queued: () => void) =>
  (sessionId: string, onlyExpired: boolean, epochId: number) =>
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
          if (row === undefined) return { closed: false, queued: false }
          const unspent = row.budget - row.spent
          if (row.funding_kind === "credit" && row.key_id !== null) {
            yield* sql`INSERT INTO credit_unfolded (request_id, key_id, wallet, authorized, charged)
                       VALUES (${row.funding_request_id}, ${row.key_id}, ${row.payer}, ${row.budget}, ${row.spent})`
            yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                       VALUES (${row.funding_request_id}, ${row.payer}, 'session_released', ${unspent}, ${sessionId})`
            yield* sql`UPDATE sessions SET refund_ref = ${"balance"} WHERE session_id = ${sessionId}`
            return { closed: true, queued: true }
          }
          if (unspent > 0) {
            yield* sql`INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
                       VALUES (${row.funding_request_id}, ${row.payer}, ${unspent}, ${epochId}, 'due')`
            yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                       VALUES (${row.funding_request_id}, ${row.payer}, 'refund_due', ${unspent}, ${sessionId})`
          }
          return { closed: true, queued: false }
        })
      )
      .pipe(
        Effect.map((result) => {
          if (result.queued) queued()
          return result.closed
        }),
        Effect.orDie,
        Effect.withSpan("Ledger.closeSession")
      )
