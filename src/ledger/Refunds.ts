import { Clock, Effect, Metric, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, type Hex } from "viem"
import { idList } from "../db/IdList.ts"
import { Ledger } from "./Ledger.ts"
import { Treasury } from "./Treasury.ts"

const DueGroup = Schema.Struct({
  payer: Schema.String,
  total: Schema.String,
  request_ids: Schema.Array(Schema.String)
})
const decodeGroups = Schema.decodeUnknownEffect(Schema.Array(DueGroup))

/** Base units of refunds due whose batch the treasury could not send; retried with a backoff. */
export const refundsUnpayable = Metric.gauge("svc_refunds_unpayable_base_units", {
  description: "Base units of refunds due that the treasury could not pay (a failed batch awaiting its retry)"
})

/** The wait before a payer's failed refund batch is tried again: 1 s, doubling per failure, at most this. */
export const REFUND_RETRY_MAX_MS = 60_000
export const refundRetryDelayMs = (failures: number) =>
  Math.min(REFUND_RETRY_MAX_MS, 1_000 * 2 ** Math.min(16, Math.max(0, failures - 1)))

/**
 * Step 1 of the epoch close: the overage of every captured request whose payment landed is refunded
 * once its epoch has ended, batched per payer in one transfer from the treasury, or credited to the
 * payer's balance below the payout floor. A batch is one transfer however often it is resumed (its
 * purpose in ledger/Treasury.ts); each batch stands alone. Run under the epoch-close lock.
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
    // Payers whose last batch was not sent or moved nothing (a treasury that cannot cover it): when it
    // is tried again and what it held. In memory: a restarted instance simply tries once more at once.
    const unpayable = new Map<string, { failures: number; retryAt: number; amount: bigint }>()
    const publishUnpayable = Effect.suspend(() =>
      Metric.update(refundsUnpayable, Number([...unpayable.values()].reduce((sum, u) => sum + u.amount, 0n)))
    )
    const failed = (payer: string, amount: bigint, reason: string) =>
      Effect.gen(function* () {
        const failures = (unpayable.get(payer)?.failures ?? 0) + 1
        const delay = refundRetryDelayMs(failures)
        unpayable.set(payer, { failures, retryAt: (yield* Clock.currentTimeMillis) + delay, amount })
        yield* Effect.logWarning("refund batch not paid; back to due", {
          reason,
          payer,
          failures,
          retry_in_ms: delay
        })
      })

    /**
     * Writes the refund into the receipts it belongs to. A receipt already in an anchored (or closing)
     * epoch is never re-signed: a refund settled after that (a session's close-out) stays in the ledger.
     */
    const stampRefund = (requestIds: ReadonlyArray<string>, refundRef: string) =>
      Effect.gen(function* () {
        const open = yield* sql<{ request_id: string }>`
        SELECT request_id FROM receipts WHERE request_id IN ${idList(sql, requestIds)} AND leaf IS NULL
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
              WHERE request_id IN ${idList(sql, requestIds)} AND status = 'paying' RETURNING request_id`
              if (paid.length === 0) return
              yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                       SELECT request_id, payer, 'refund_paid', amount, ${hash} FROM refunds
                       WHERE request_id IN ${idList(
                         sql,
                         paid.map((p) => p.request_id)
                       )}`
            })
          )
          .pipe(Effect.orDie)
        yield* stampRefund(requestIds, hash)
        yield* Effect.annotateCurrentSpan({ payer, refunds: requestIds.length })
      })

    const backToDue = (requestIds: ReadonlyArray<string>) =>
      sql`UPDATE refunds SET status = 'due', tx_hash = NULL WHERE request_id IN ${idList(sql, requestIds)}`.pipe(
        Effect.orDie
      )

    /**
     * Sends a claimed batch (its rows `paying`) and settles it by what the chain did. Sending is idempotent
     * per batch (ledger/Treasury.ts: the purpose is the payer and the exact set of refunds), so a batch
     * resumed after a crash gets the transaction already recorded for it, never a second transfer. Only a
     * send that recorded nothing, or a transfer that moved nothing, puts the batch back to `due`; a wait
     * that fails leaves it `paying` with its hash for the next pass.
     */
    const payBatch = (payer: string, total: bigint, requestIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const sent = yield* treasury
          .send({ _tag: "RefundBatch", to: getAddress(payer), amount: total, requestIds })
          .pipe(Effect.result)
        if (sent._tag === "Failure") {
          yield* failed(payer, total, sent.failure.message)
          return yield* backToDue(requestIds)
        }
        const hash = sent.success
        yield* sql`UPDATE refunds SET tx_hash = ${hash} WHERE request_id IN ${idList(sql, requestIds)}`.pipe(
          Effect.orDie
        )
        const outcome = yield* treasury.confirm(hash).pipe(Effect.option)
        if (Option.isNone(outcome)) return
        // The backoff ends when a transfer lands, not when one is sent: a transfer that reverts counts as
        // one more failure, so a payer whose refunds keep reverting is tried 1 s, 2 s, 4 s ... apart.
        if (outcome.value.status === "success") {
          unpayable.delete(payer)
          yield* markPaid(payer, hash, requestIds)
        } else {
          yield* failed(payer, total, "the transfer moved nothing")
          yield* backToDue(requestIds)
        }
      })

    /** Batches a crashed or failed pass left `paying` (with or without a hash) are sent again: the same transaction. */
    const resumePaying = Effect.gen(function* () {
      const rows = yield* sql`
      SELECT payer, sum(amount)::text AS total, array_agg(request_id ORDER BY request_id) AS request_ids FROM refunds
      WHERE status = 'paying' GROUP BY payer, tx_hash
    `.pipe(Effect.flatMap(decodeGroups), Effect.orDie)
      for (const row of rows) yield* payBatch(row.payer, BigInt(row.total), row.request_ids)
    })

    const settleRefunds = Effect.gen(function* () {
      const epoch = yield* currentEpoch
      const now = yield* Clock.currentTimeMillis
      yield* resumePaying
      // Claim due refunds of ended epochs whose payment landed; credit small ones in the same step.
      const groups = yield* sql
        .withTransaction(
          Effect.gen(function* () {
            const due = yield* sql`
            SELECT r.payer, sum(r.amount)::text AS total, array_agg(r.request_id ORDER BY r.request_id) AS request_ids
            FROM refunds r JOIN x402_authorizations a ON a.request_id = r.request_id
            WHERE r.status = 'due' AND r.epoch_id < ${epoch} AND a.status = 'landed'
            GROUP BY r.payer ORDER BY r.payer
          `.pipe(Effect.flatMap(decodeGroups))
            // A payer whose batch failed waits out its backoff before its refunds are claimed again.
            const ready = due.filter(
              (group) =>
                Number(group.total) < payoutFloor || (unpayable.get(group.payer)?.retryAt ?? 0) <= now
            )
            for (const group of ready) {
              if (Number(group.total) >= payoutFloor) {
                yield* sql`UPDATE refunds SET status = 'paying' WHERE request_id IN ${idList(sql, group.request_ids)}`
              } else {
                yield* sql`UPDATE refunds SET status = 'credited', settled_at = now()
                         WHERE request_id IN ${idList(sql, group.request_ids)}`
                yield* sql`
                INSERT INTO wallet_balances (wallet, available) VALUES (${group.payer}, ${group.total})
                ON CONFLICT (wallet) DO UPDATE
                SET available = wallet_balances.available + EXCLUDED.available, updated_at = now()
              `
                yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                         SELECT request_id, payer, 'refund_credited', amount, 'balance' FROM refunds
                         WHERE request_id IN ${idList(sql, group.request_ids)}`
              }
            }
            return ready
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
        yield* payBatch(group.payer, BigInt(group.total), group.request_ids)
      }
      yield* publishUnpayable
      return settled
    }).pipe(Effect.withSpan("Epochs.settleRefunds"))

    return { settle: settleRefunds }
  })
