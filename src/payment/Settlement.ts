import { Clock, Context, Effect, Layer, Semaphore } from "effect"
import { getAddress, type Hex } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Chain, type ChainError } from "../chain/Chain.ts"
import { Authorizations, type ClaimedAuthorization } from "../ledger/Authorizations.ts"
import { Ledger, permit2NonceOf } from "../ledger/Ledger.ts"
import type { OutgoingTransfer } from "../ledger/Transfers.ts"
import { Treasury } from "../ledger/Treasury.ts"

const RECOVER_EVERY_MS = 30_000
/**
 * Passes of the background loop that may be in flight at once (D426): a pass waits for its transfers'
 * block, so passes one after another drain at most a claim (`CLAIM_LIMIT`) per block; a new pass starts every 250 ms
 * while fewer than this many are waiting.
 */
export const MAX_PASSES = 4
/**
 * Sends, and landings recorded, at once across every pass (D426): what one pass did alone. Overlapping
 * passes overlap their waits for blocks, not their chain and database work: 8 passes sending 4 each kept
 * the embedded chain busy with 32 gas estimates at once and piled landings onto the payer's outstanding
 * row, and the paid path's chain reads and x402 reservations queued behind them (x402 p50 at 100/s 17 →
 * 330–490 ms in bench:load).
 */
export const SENDS_AT_ONCE = 4

/**
 * Submits captured x402 authorizations on chain, off every response's path: an `exact` one as the
 * signed EIP-3009 transfer, an `upto` one as a settlement of exactly its charge through the upto proxy
 * (Permit2 spends its nonce, so it can never transfer twice). A row is claimed with `FOR UPDATE SKIP
 * LOCKED`, so any number of router instances share the queue without double submission; a failure is
 * recorded and retried until the authorization's `validBefore` (an `upto` permit's deadline) passes.
 * Nothing here is ever dropped.
 */
export class Settlement extends Context.Service<
  Settlement,
  {
    /** One pass over the queue; returns how many authorizations it handled. */
    readonly runOnce: Effect.Effect<number>
  }
>()("router/payment/Settlement") {
  static readonly make = Effect.gen(function* () {
    const chain = yield* Chain
    const ledger = yield* Ledger
    const treasury = yield* Treasury
    const authorizations = yield* Authorizations
    const sending = yield* Semaphore.make(SENDS_AT_ONCE)
    const landing = yield* Semaphore.make(SENDS_AT_ONCE)

    const landed = (row: ClaimedAuthorization, hash: Hex) =>
      Effect.gen(function* () {
        if (yield* authorizations.recordLanded(row, hash))
          yield* ledger.finalizeReceipt(row.request_id, { payment_ref: hash, settlement: "landed" })
      }).pipe(landing.withPermit)

    const failed = (row: ClaimedAuthorization, reason: string) =>
      Effect.gen(function* () {
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const expired = BigInt(row.valid_before) <= BigInt(nowS)
        yield* authorizations.recordFailed(row, reason, expired)
        yield* Effect.logWarning("settlement attempt failed", { request_id: row.request_id, reason, expired })
        if (expired) yield* ledger.finalizeReceipt(row.request_id, { settlement: "failed" })
      })

    /**
     * Whether an earlier attempt already moved the money: the token's own record of the nonce (Permit2's
     * nonce bitmap for `upto`) is the truth, whatever happened to our wait for a receipt.
     */
    const alreadyUsed = (row: ClaimedAuthorization) =>
      row.scheme === "upto"
        ? chain.permit2NonceUsed(getAddress(row.payer), permit2NonceOf(row.nonce))
        : chain.authorizationState(getAddress(row.payer), row.nonce as Hex)

    /**
     * Submission is idempotent per request (ledger/Treasury.ts): a retry after a crash or a failed wait
     * gets the transaction already recorded for this authorization, with its hash, never a second one.
     */
    const transferOf = (row: ClaimedAuthorization, signature: Hex): OutgoingTransfer =>
      row.scheme === "upto"
        ? {
            _tag: "UptoSettlement",
            requestId: row.request_id,
            amount: BigInt(row.value),
            permit: {
              from: getAddress(row.payer),
              permitted: { token: chain.token, amount: BigInt(row.ceiling ?? row.value) },
              spender: chain.uptoProxy,
              nonce: permit2NonceOf(row.nonce),
              deadline: BigInt(row.valid_before),
              witness: {
                to: chain.treasury,
                facilitator: chain.routerSigner,
                validAfter: BigInt(row.valid_after)
              },
              signature
            }
          }
        : {
            _tag: "X402Settlement",
            requestId: row.request_id,
            authorization: {
              from: getAddress(row.payer),
              to: chain.treasury,
              value: BigInt(row.value),
              validAfter: BigInt(row.valid_after),
              validBefore: BigInt(row.valid_before),
              nonce: row.nonce as Hex,
              signature
            }
          }

    // Nothing recorded for this authorization (a refused estimate), or a wait that failed: the token says
    // whether it is used. Used with no transaction of ours means someone else submitted it.
    const unresolved = (row: ClaimedAuthorization, e: ChainError) =>
      Effect.gen(function* () {
        const ours = yield* treasury.recorded(transferOf(row, (row.signature ?? "0x") as Hex))
        const used = yield* alreadyUsed(row).pipe(Effect.orElseSucceed(() => false))
        if (used) return yield* landed(row, (ours ?? row.tx_hash ?? "unknown") as Hex)
        // A transaction of ours still open is not a failure: the next pass confirms it.
        return yield* failed(row, `${e.reason}: ${e.message}`)
      })

    /** Sends the row's transfer (or adopts the one recorded for it) and records its hash; none: handled. */
    const submitOne = (row: ClaimedAuthorization) =>
      Effect.gen(function* () {
        if (row.signature === null) {
          yield* failed(row, "no signature on record")
          return undefined
        }
        const hash = yield* treasury.send(transferOf(row, row.signature as Hex))
        if (row.tx_hash !== hash) yield* authorizations.recordBroadcast(row, hash)
        return hash
      }).pipe(
        sending.withPermit,
        Effect.catchTag("ChainError", (e) => Effect.as(unresolved(row, e), undefined)),
        Effect.withSpan("Settlement.submit", { attributes: { request_id: row.request_id } })
      )

    const confirmOne = (row: ClaimedAuthorization, hash: Hex) =>
      Effect.gen(function* () {
        const outcome = yield* treasury.confirm(hash)
        if (outcome.status === "success") return yield* landed(row, hash)
        // Moved nothing; the token says whether another submission (not ours) used the authorization.
        if (yield* alreadyUsed(row)) return yield* landed(row, (row.tx_hash ?? hash) as Hex)
        return yield* failed(row, `transfer ${outcome.status}`)
      }).pipe(
        Effect.catchTag("ChainError", (e) => unresolved(row, e)),
        Effect.withSpan("Settlement.confirm", { attributes: { request_id: row.request_id } })
      )

    // A claim is stale after 3 minutes (`Authorizations.recover`): looking every 30 s, not on every
    // 250 ms pass, spares the database four statements a second that almost always change nothing.
    let recoveredAt = Number.NEGATIVE_INFINITY
    const runOnce = Effect.gen(function* () {
      const nowMs = yield* Clock.currentTimeMillis
      if (nowMs - recoveredAt >= RECOVER_EVERY_MS) {
        recoveredAt = nowMs
        yield* authorizations.recover
      }
      const rows = yield* authorizations.claimDue
      // Every claimed row is sent before any is waited for (D451): the transfers of one pass go to the
      // chain together (one block where blocks are timed) and their waits overlap. Waiting for each
      // row's block before sending the next four held a pass for a block per four rows.
      const sent = yield* Effect.forEach(rows, submitOne, { concurrency: SENDS_AT_ONCE })
      yield* Effect.forEach(
        rows,
        (row, i) => {
          const hash = sent[i]
          return hash === undefined ? Effect.void : confirmOne(row, hash)
        },
        { concurrency: "unbounded", discard: true }
      )
      return rows.length
    }).pipe(Effect.withSpan("Settlement.runOnce"))

    return Settlement.of({ runOnce })
  })

  /** The service plus its background loop. */
  static readonly layer = Layer.effect(
    Settlement,
    Effect.gen(function* () {
      const settlement = yield* Settlement.make
      const scope = yield* Effect.scope
      let running = 0
      const pass = settlement.runOnce.pipe(
        Effect.catchCause((cause) => Effect.logError("settlement pass failed", cause)),
        Effect.ensuring(
          Effect.sync(() => {
            running--
          })
        )
      )
      // Every 250 ms a pass starts unless `MAX_PASSES` are still waiting for their blocks: the count and
      // the fork in one uninterruptible step, so a pass counted is a pass that runs (and uncounts itself).
      yield* repeatInBackground(
        Effect.uninterruptible(
          Effect.suspend(() => {
            if (running >= MAX_PASSES) return Effect.void
            running++
            return Effect.asVoid(Effect.forkIn(pass, scope))
          })
        ),
        { every: "250 millis", failure: "settlement pass failed" }
      )
      return settlement
    })
  )
}
