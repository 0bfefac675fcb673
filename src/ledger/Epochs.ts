import { Clock, Config, Context, Effect, Layer, Schedule, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, type Hex } from "viem"
import { Chain } from "../chain/Chain.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { Ledger } from "./Ledger.ts"

/** Refunds below this (base units) are credited to the payer's balance instead of broadcast. */
export class PayoutConfig extends Context.Service<PayoutConfig, { readonly payoutFloor: number }>()(
  "router/ledger/PayoutConfig"
) {
  static readonly layer = Layer.effect(
    PayoutConfig,
    Effect.map(Config.Int("PAYOUT_FLOOR").pipe(Config.withDefault(5_000)), (payoutFloor) =>
      PayoutConfig.of({ payoutFloor })
    )
  )
  static readonly test = (payoutFloor: number) =>
    Layer.succeed(PayoutConfig, PayoutConfig.of({ payoutFloor }))
}

export const epochOf = (createdAtMs: number, epochSeconds: number) =>
  Math.floor(createdAtMs / (epochSeconds * 1000))

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
 * Epoch close: the overage of every captured request (authorized minus charged) is refunded
 * once its epoch has ended and its payment has landed, batched per payer in one transfer
 * from the treasury, or credited to the payer's balance below the payout floor. One
 * instance at a time runs a close (a Postgres advisory lock); a crash between broadcast
 * and confirmation is resumed from the recorded transaction hash.
 */
export class Epochs extends Context.Service<
  Epochs,
  {
    readonly currentEpoch: Effect.Effect<number>
    /** Settles the refunds of every ended epoch; returns how many refund rows it settled. */
    readonly closeEnded: Effect.Effect<number>
  }
>()("router/ledger/Epochs") {
  static readonly make = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const ledger = yield* Ledger
    const { epochSeconds } = yield* RouterConfig
    const { payoutFloor } = yield* PayoutConfig

    const currentEpoch = Effect.map(Clock.currentTimeMillis, (now) => epochOf(now, epochSeconds))

    const markPaid = (payer: string, hash: Hex, requestIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`UPDATE refunds SET status = 'paid', settled_at = now()
                         WHERE request_id IN ${sql.in(requestIds)} AND status = 'paying'`
              yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                         SELECT request_id, payer, 'refund_paid', amount, ${hash} FROM refunds
                         WHERE request_id IN ${sql.in(requestIds)}`
            })
          )
          .pipe(Effect.orDie)
        yield* Effect.forEach(requestIds, (id) => ledger.finalizeReceipt(id, { refund_ref: hash }), {
          discard: true
        })
        yield* Effect.annotateCurrentSpan({ payer, refunds: requestIds.length })
      })

    /** Broadcasts recorded before a crash are confirmed, not re-sent. */
    const resumePaying = Effect.gen(function* () {
      const rows = yield* sql`
        SELECT payer, tx_hash, array_agg(request_id) AS request_ids FROM refunds
        WHERE status = 'paying' AND tx_hash IS NOT NULL GROUP BY payer, tx_hash
      `.pipe(Effect.flatMap(decodePaying), Effect.orDie)
      for (const row of rows) {
        const outcome = yield* chain.waitForReceipt(row.tx_hash as Hex)
        if (outcome.status === "success") yield* markPaid(row.payer, row.tx_hash as Hex, row.request_ids)
        else
          yield* sql`UPDATE refunds SET status = 'due', tx_hash = NULL WHERE request_id IN ${sql.in(row.request_ids)}`.pipe(
            Effect.orDie
          )
      }
    })

    const closeEnded = Effect.gen(function* () {
      const epoch = yield* currentEpoch
      yield* resumePaying
      // Claim due refunds of ended epochs whose payment landed; credit small ones in the same step.
      const groups = yield* sql
        .withTransaction(
          Effect.gen(function* () {
            const locked = yield* sql<{ ok: boolean }>`SELECT pg_try_advisory_xact_lock(7402001) AS ok`
            if (locked[0]?.ok !== true) return []
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
          yield* Effect.forEach(
            group.request_ids,
            (id) => ledger.finalizeReceipt(id, { refund_ref: `balance:${group.payer}` }),
            { discard: true }
          )
          continue
        }
        const hash = yield* chain.transferFromTreasury(getAddress(group.payer), BigInt(group.total))
        yield* sql`UPDATE refunds SET tx_hash = ${hash} WHERE request_id IN ${sql.in(group.request_ids)}`.pipe(
          Effect.orDie
        )
        const outcome = yield* chain.waitForReceipt(hash)
        if (outcome.status === "success") yield* markPaid(group.payer, hash, group.request_ids)
        else
          yield* sql`UPDATE refunds SET status = 'due', tx_hash = NULL WHERE request_id IN ${sql.in(group.request_ids)}`.pipe(
            Effect.orDie
          )
      }
      return settled
    }).pipe(
      Effect.catchTag("ChainError", (e) =>
        Effect.as(Effect.logWarning("refund batch failed; will retry", e.message), 0)
      ),
      Effect.withSpan("Epochs.closeEnded")
    )

    return Epochs.of({ currentEpoch, closeEnded })
  })

  static readonly layer = Layer.effect(
    Epochs,
    Effect.gen(function* () {
      const epochs = yield* Epochs.make
      yield* epochs.closeEnded.pipe(
        Effect.catchCause((cause) => Effect.logError("epoch close failed", cause)),
        Effect.repeat(Schedule.spaced("1 second")),
        Effect.forkScoped
      )
      return epochs
    })
  )
}
