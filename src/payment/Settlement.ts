import { Clock, Context, Effect, Layer, Schedule, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, type Hex } from "viem"
import { Chain } from "../chain/Chain.ts"
import { Ledger } from "../ledger/Ledger.ts"
import { Treasury } from "../ledger/Treasury.ts"
import { creditLandedDeposit } from "./Credits.ts"

const Claimed = Schema.Struct({
  payer: Schema.String,
  nonce: Schema.String,
  request_id: Schema.String,
  value: Schema.String,
  valid_after: Schema.String,
  valid_before: Schema.String,
  signature: Schema.NullOr(Schema.String),
  tx_hash: Schema.NullOr(Schema.String),
  attempts: Schema.Number
})
type Claimed = typeof Claimed.Type
const decodeClaimed = Schema.decodeUnknownEffect(Schema.Array(Claimed))

/** Retry backoff for a failed submission: 2 s, 4 s, ... capped at 60 s. */
const backoffSeconds = (attempts: number) => Math.min(60, 2 ** Math.min(6, attempts))

/**
 * Submits captured x402 authorizations on chain, off every response's path. A row is
 * claimed with `FOR UPDATE SKIP LOCKED`, so any number of router instances share the
 * queue without double submission; a failure is recorded and retried until the
 * authorization's `validBefore` passes. Nothing here is ever dropped.
 */
export class Settlement extends Context.Service<
  Settlement,
  {
    /** One pass over the queue; returns how many authorizations it handled. */
    readonly runOnce: Effect.Effect<number>
  }
>()("router/payment/Settlement") {
  static readonly make = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const ledger = yield* Ledger
    const treasury = yield* Treasury

    const claim = sql`
      UPDATE x402_authorizations SET status = 'submitted', attempts = attempts + 1, updated_at = now()
      WHERE (payer, nonce) IN (
        SELECT payer, nonce FROM x402_authorizations
        WHERE status = 'pending' AND next_attempt_at <= now()
        ORDER BY created_at LIMIT 16 FOR UPDATE SKIP LOCKED
      )
      RETURNING payer, nonce, request_id, value::text, valid_after::text, valid_before::text, signature, tx_hash,
                attempts
    `.pipe(Effect.flatMap(decodeClaimed), Effect.orDie)

    const landed = (row: Claimed, hash: Hex) =>
      Effect.gen(function* () {
        const recorded = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              // Only the claim that still holds the row records the landing (never twice).
              const rows = yield* sql`
                UPDATE x402_authorizations SET status = 'landed', tx_hash = ${hash}, signature = NULL, updated_at = now()
                WHERE payer = ${row.payer} AND nonce = ${row.nonce} AND status = 'submitted'
                RETURNING nonce
              `
              if (rows.length === 0) return false
              yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                         VALUES (${row.request_id}, 'treasury', 'settled', ${row.value}, ${hash})`
              yield* creditLandedDeposit(sql, row.request_id, hash)
              return true
            })
          )
          .pipe(Effect.orDie)
        if (recorded)
          yield* ledger.finalizeReceipt(row.request_id, { payment_ref: hash, settlement: "landed" })
      })

    const failed = (row: Claimed, reason: string) =>
      Effect.gen(function* () {
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const expired = BigInt(row.valid_before) <= BigInt(nowS)
        yield* sql`
          UPDATE x402_authorizations
          SET status = ${expired ? "failed" : "pending"}, last_error = ${reason.slice(0, 300)},
              next_attempt_at = now() + make_interval(secs => ${backoffSeconds(row.attempts)}), updated_at = now()
          WHERE payer = ${row.payer} AND nonce = ${row.nonce} AND status = 'submitted'
        `.pipe(Effect.orDie)
        yield* Effect.logWarning("settlement attempt failed", { request_id: row.request_id, reason, expired })
        if (expired) {
          yield* ledger.finalizeReceipt(row.request_id, { settlement: "failed" })
          // A session funded by this authorization can take no further turns (402 session_dead).
          yield* sql`UPDATE sessions SET status = 'dead' WHERE funding_request_id = ${row.request_id} AND status = 'open'`.pipe(
            Effect.orDie
          )
        }
      })

    /**
     * Whether an earlier attempt already moved the money: the token's own record of the nonce is
     * the truth, whatever happened to our wait for a receipt.
     */
    const alreadyUsed = (row: Claimed) => chain.authorizationState(getAddress(row.payer), row.nonce as Hex)

    const settleOne = (row: Claimed) =>
      Effect.gen(function* () {
        if (row.attempts > 1 && (yield* alreadyUsed(row))) {
          return yield* landed(row, (row.tx_hash ?? "unknown") as Hex)
        }
        if (row.signature === null) return yield* failed(row, "no signature on record")
        const authorization = {
          from: getAddress(row.payer),
          to: chain.treasury,
          value: BigInt(row.value),
          validAfter: BigInt(row.valid_after),
          validBefore: BigInt(row.valid_before),
          nonce: row.nonce as Hex,
          signature: row.signature as Hex
        }
        const hash = yield* treasury.send({
          _tag: "X402Settlement",
          requestId: row.request_id,
          authorization
        })
        yield* sql`UPDATE x402_authorizations SET tx_hash = ${hash} WHERE payer = ${row.payer} AND nonce = ${row.nonce}`.pipe(
          Effect.orDie
        )
        const outcome = yield* treasury.confirm(hash)
        if (outcome.status === "success") return yield* landed(row, hash)
        // A revert after an earlier attempt may mean that attempt landed: the token says which.
        if (yield* alreadyUsed(row)) return yield* landed(row, (row.tx_hash ?? hash) as Hex)
        return yield* failed(row, "transfer reverted")
      }).pipe(
        Effect.catchTag("ChainError", (e) =>
          // A failed send or wait can hide a transfer that did land (a resend then fails at gas
          // estimation): ask the token before recording a failure.
          alreadyUsed(row).pipe(
            Effect.orElseSucceed(() => false),
            Effect.flatMap((used) =>
              used ? landed(row, (row.tx_hash ?? "unknown") as Hex) : failed(row, `${e.reason}: ${e.message}`)
            )
          )
        ),
        Effect.withSpan("Settlement.settle", { attributes: { request_id: row.request_id } })
      )

    /** Rows left `submitted` by an instance that died mid-flight go back to the queue. */
    const recover = sql`
      UPDATE x402_authorizations SET status = 'pending', updated_at = now()
      WHERE status = 'submitted' AND updated_at < now() - interval '3 minutes'
    `.pipe(Effect.orDie)

    const runOnce = Effect.gen(function* () {
      yield* recover
      const rows = yield* claim
      yield* Effect.forEach(rows, settleOne, { concurrency: 4, discard: true })
      return rows.length
    }).pipe(Effect.withSpan("Settlement.runOnce"))

    return Settlement.of({ runOnce })
  })

  /** The service plus its background loop. */
  static readonly layer = Layer.effect(
    Settlement,
    Effect.gen(function* () {
      const settlement = yield* Settlement.make
      yield* settlement.runOnce.pipe(
        Effect.catchCause((cause) => Effect.logError("settlement pass failed", cause)),
        Effect.repeat(Schedule.spaced("250 millis")),
        Effect.forkScoped
      )
      return settlement
    })
  )
}
