import { Effect, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, type Hex } from "viem"
import { Ledger } from "./Ledger.ts"
import { Treasury } from "./Treasury.ts"

const DueGroup = Schema.Struct({
  payer: Schema.String,
  total: Schema.String,
  request_ids: Schema.Array(Schema.String)
})
const decodeGroups = Schema.decodeUnknownEffect(Schema.Array(DueGroup))
const Paying = Schema.Struct({
  payer: Schema.String,
  tx_hash: Schema.String,
  request_ids: Schema.Array(Schema.String)
})
const decodePaying = Schema.decodeUnknownEffect(Schema.Array(Paying))

/**
 * Step 1 of the epoch close: the overage of every captured request whose payment landed is refunded
 * once its epoch has ended, batched per payer in one transfer from the treasury, or credited to the
 * payer's balance below the payout floor. A broadcast recorded before a crash is confirmed, never
 * re-sent; each batch stands alone. Run under the epoch-close lock.
 */
export const makeRefunds = (options: {
  readonly payoutFloor: number
  readonly currentEpoch: Effect.Effect<number>
}) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const ledger = yield* Ledger
    const treasury = yield* Treasury
    const { payoutFloor, currentEpoch } = options

    /**
     * Writes the refund into the receipts it belongs to. A receipt already in an anchored (or closing)
     * epoch is never re-signed: a refund settled after that (a session's close-out) stays in the ledger.
     */
    const stampRefund = (requestIds: ReadonlyArray<string>, refundRef: string) =>
      Effect.gen(function* () {
        const open = yield* sql<{ request_id: string }>`
        SELECT request_id FROM receipts WHERE request_id IN ${sql.in(requestIds)} AND leaf IS NULL
      `.pipe(Effect.orDie)
        yield* Effect.forEach(
          open,
          (row) => ledger.finalizeReceipt(row.request_id, { refund_ref: refundRef }),
          {
            discard: true
          }
        )
      })

    const markPaid = (payer: string, hash: Hex, requestIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const paid = yield* sql<{ request_id: string }>`
              UPDATE refunds SET status = 'paid', settled_at = now()
              WHERE request_id IN ${sql.in(requestIds)} AND status = 'paying' RETURNING request_id`
              if (paid.length === 0) return
              yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                       SELECT request_id, payer, 'refund_paid', amount, ${hash} FROM refunds
                       WHERE request_id IN ${sql.in(paid.map((p) => p.request_id))}`
            })
          )
          .pipe(Effect.orDie)
        yield* stampRefund(requestIds, hash)
        yield* Effect.annotateCurrentSpan({ payer, refunds: requestIds.length })
      })

    const backToDue = (requestIds: ReadonlyArray<string>) =>
      sql`UPDATE refunds SET status = 'due', tx_hash = NULL WHERE request_id IN ${sql.in(requestIds)}`.pipe(
        Effect.orDie
      )

    /** Broadcasts recorded before a crash are confirmed, not re-sent. */
    const resumePaying = Effect.gen(function* () {
      const rows = yield* sql`
      SELECT payer, tx_hash, array_agg(request_id) AS request_ids FROM refunds
      WHERE status = 'paying' AND tx_hash IS NOT NULL GROUP BY payer, tx_hash
    `.pipe(Effect.flatMap(decodePaying), Effect.orDie)
      for (const row of rows) {
        const outcome = yield* treasury.confirm(row.tx_hash as Hex)
        if (outcome.status === "success") yield* markPaid(row.payer, row.tx_hash as Hex, row.request_ids)
        else yield* backToDue(row.request_ids)
      }
    })

    const settleRefunds = Effect.gen(function* () {
      const epoch = yield* currentEpoch
      yield* resumePaying
      // Claimed by a pass that died before its send was recorded: back to due (docs/decisions.md D21).
      yield* sql`UPDATE refunds SET status = 'due' WHERE status = 'paying' AND tx_hash IS NULL`.pipe(
        Effect.orDie
      )
      // Claim due refunds of ended epochs whose payment landed; credit small ones in the same step.
      const groups = yield* sql
        .withTransaction(
          Effect.gen(function* () {
            const due = yield* sql`
            SELECT r.payer, sum(r.amount)::text AS total, array_agg(r.request_id ORDER BY r.request_id) AS request_ids
            FROM refunds r JOIN x402_authorizations a ON a.request_id = r.request_id
            WHERE r.status = 'due' AND r.epoch_id < ${epoch} AND a.status = 'landed'
            GROUP BY r.payer
          `.pipe(Effect.flatMap(decodeGroups))
            for (const group of due) {
              if (Number(group.total) >= payoutFloor) {
                yield* sql`UPDATE refunds SET status = 'paying' WHERE request_id IN ${sql.in(group.request_ids)}`
              } else {
                yield* sql`UPDATE refunds SET status = 'credited', settled_at = now()
                         WHERE request_id IN ${sql.in(group.request_ids)}`
                yield* sql`
                INSERT INTO wallet_balances (wallet, available) VALUES (${group.payer}, ${group.total})
                ON CONFLICT (wallet) DO UPDATE
                SET available = wallet_balances.available + EXCLUDED.available, updated_at = now()
              `
                yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                         SELECT request_id, payer, 'refund_credited', amount, 'balance' FROM refunds
                         WHERE request_id IN ${sql.in(group.request_ids)}`
              }
            }
            return due
          })
        )
        .pipe(Effect.orDie)
      let settled = 0
      for (const group of groups) {
        settled += group.request_ids.length
        if (Number(group.total) < payoutFloor) {
          yield* stampRefund(group.request_ids, `balance:${group.payer}`)
          continue
        }
        // Each batch stands alone: a send that fails puts only its own refunds back to `due`
        // (the next pass retries them) and the other payers' batches still go out.
        const sent = yield* treasury
          .send({
            _tag: "RefundBatch",
            to: getAddress(group.payer),
            amount: BigInt(group.total),
            requestIds: group.request_ids
          })
          .pipe(
            Effect.tapError((e) => Effect.logWarning("refund batch not sent; back to due", e.message)),
            Effect.option
          )
        if (Option.isNone(sent)) {
          yield* backToDue(group.request_ids)
          continue
        }
        const hash = sent.value
        yield* sql`UPDATE refunds SET tx_hash = ${hash} WHERE request_id IN ${sql.in(group.request_ids)}`.pipe(
          Effect.orDie
        )
        // A failed wait leaves the batch `paying` with its hash: the next pass confirms it.
        const outcome = yield* treasury.confirm(hash).pipe(Effect.option)
        if (Option.isNone(outcome)) continue
        if (outcome.value.status === "success") yield* markPaid(group.payer, hash, group.request_ids)
        else yield* backToDue(group.request_ids)
      }
      return settled
    }).pipe(
      Effect.catchTag("ChainError", (e) =>
        Effect.as(Effect.logWarning("refund batch failed; will retry", e.message), 0)
      ),
      Effect.withSpan("Epochs.settleRefunds")
    )

    return { settle: settleRefunds }
  })
