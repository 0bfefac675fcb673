import { Context, Duration, Effect, Layer, Semaphore } from "effect"
import { SqlClient } from "effect/sql"
import type { Hash } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Chain, type ChainError } from "../chain/Chain.ts"
import { type OutgoingTransfer, purposeOf, type TransferOutcome } from "./Transfers.ts"
import { type Confirmed, makeTreasuryConfirm, type OnConfirmed } from "./TreasuryConfirm.ts"
import { makeTreasuryLooks } from "./TreasuryLooks.ts"
import { makeTreasuryRecords } from "./TreasuryRecords.ts"
import { makeTreasurySend, type Sent } from "./TreasurySend.ts"

export type { Confirmed, OnConfirmed } from "./TreasuryConfirm.ts"
export { HEAD_WAIT_POLLS } from "./TreasuryLooks.ts"
export { NONCE_TRUST_MS } from "./TreasuryRecords.ts"
export type { Sent } from "./TreasurySend.ts"

export interface TreasuryOptions {
  /** Blocks a receipt must be deep before a transfer counts as final (1: its own block). */
  readonly confirmations?: number
  /** How long `confirm` waits for a transfer to be final before failing `Timeout` (it stays recorded). */
  readonly confirmTimeout?: Duration.Input
  /** Between two looks at a transaction that is not yet mined. */
  readonly pollInterval?: Duration.Input
}

/**
 * Gas estimates and broadcasts one treasury has in flight at once, whoever asked (D426, D49x): the settlement
 * passes that overlap share it, so the chain never estimates a whole claim's transfers at once.
 */
export const CHAIN_CALLS_AT_ONCE = 4

export interface TreasuryShape {
  /**
   * Sends one transfer exactly once (docs/decisions.md D165): the live transaction recorded for its
   * purpose when there is one (rebroadcast if not yet mined), else a new one, signed locally with a
   * nonce taken under the sender's row lock and recorded before it is broadcast. Returns its hash
   * whatever the broadcast did; fails only when nothing is recorded for the purpose (the call would
   * revert now, or the node or the database could not be reached before signing).
   */
  readonly send: (transfer: OutgoingTransfer) => Effect.Effect<Hash, ChainError>
  /**
   * `send` for many transfers at once (D490): the purposes already recorded are adopted; the others are
   * estimated (outside any lock), then signed with consecutive nonces and recorded together in one
   * database transaction per sender, which locks the sender's row once; then each is broadcast and the
   * broadcasts are noted in one statement. One result per transfer, in order: a transfer refused (its
   * estimate reverts, its sender has no key) fails alone.
   */
  readonly sendMany: (transfers: ReadonlyArray<OutgoingTransfer>) => Effect.Effect<ReadonlyArray<Sent>>
  /**
   * Waits until a sent transfer is final, rebroadcasting its recorded bytes while the node does not know
   * it. Fails `Timeout` after `confirmTimeout` (the transfer stays recorded; the recovery loop goes on).
   */
  readonly confirm: (hash: Hash) => Effect.Effect<TransferOutcome, ChainError>
  /**
   * `confirm` for many hashes at once (D491): their records are read in one statement, and each look (one a
   * block) reads every open one's state in the same turn and writes what it found in one statement. One
   * result per hash, in order; a hash that fails (the node unreachable, `Timeout`) fails alone. Each look's
   * finished hashes are handed to `onFinished` as soon as that look is written (D516), before the next look.
   */
  readonly confirmMany: (
    hashes: ReadonlyArray<Hash>,
    onFinished?: OnConfirmed
  ) => Effect.Effect<ReadonlyArray<Confirmed>>
  /** The live transaction recorded for this transfer's purpose, if any. */
  readonly recorded: (transfer: OutgoingTransfer) => Effect.Effect<Hash | undefined>
  /**
   * Every transaction ever recorded for this transfer's purpose, whatever its record says (a `void` or
   * `reverted` record is what a look found, and a look can be wrong: D533), oldest first.
   */
  readonly attempts: (transfer: OutgoingTransfer) => Effect.Effect<ReadonlyArray<Hash>>
  /**
   * One recovery pass: every recorded transaction not yet final, per sender in nonce order, is looked up,
   * finalized when mined, rebroadcast (the same bytes) when the node does not know it, or marked `void`
   * when its nonce was taken by another transaction. Returns how many are still open.
   */
  readonly recover: Effect.Effect<number>
}

/**
 * The one way money (or an anchor) leaves the router: x402 settlement submissions (`exact` and `upto`), refund batches,
 * provider payouts, withdrawals and epoch anchors, each exactly once (docs/decisions.md D86, D165-D171).
 * Callers keep their own records (the claim, and the hash before they await it); a caller that resumes
 * after a crash calls `send` again with the same transfer and gets the transaction already recorded.
 */
export class Treasury extends Context.Service<Treasury, TreasuryShape>()("router/ledger/Treasury") {
  static readonly make = (options: TreasuryOptions = {}) =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const sql = yield* SqlClient.SqlClient
      const confirmations = Math.max(1, options.confirmations ?? 1)
      const confirmTimeout = Duration.fromInputUnsafe(options.confirmTimeout ?? "120 seconds")
      const pollInterval = Duration.fromInputUnsafe(
        options.pollInterval ?? (chain.mode === "embedded" ? "100 millis" : "1 second")
      )
      const chainCalls = yield* Semaphore.make(CHAIN_CALLS_AT_ONCE)

      // The chain's head, asked at most once a poll interval however many confirms wait (D452).
      const head = yield* Effect.cachedWithTTL(chain.blockNumber(), pollInterval)

      // The book (SQL and nonce trust), the looks at the chain, the sends and the confirms: each made from
      // what it uses, the later ones from the earlier ones.
      const records = makeTreasuryRecords(sql, chain)
      const looks = makeTreasuryLooks({ chain, records, chainCalls, head, pollInterval, confirmations })
      const { send, sendMany } = makeTreasurySend({ chain, records, looks, chainCalls })
      const { confirm, confirmMany, recover } = makeTreasuryConfirm({
        chain,
        records,
        looks,
        head,
        confirmTimeout
      })
      const { liveForAll, everyAttempt } = records

      const recorded = (transfer: OutgoingTransfer) => {
        const purpose = purposeOf(transfer)
        return Effect.map(liveForAll([purpose]), (live) => live.get(purpose)?.tx_hash as Hash | undefined)
      }

      const attempts = (transfer: OutgoingTransfer) =>
        Effect.map(everyAttempt(purposeOf(transfer)), (rows) => rows.map((row) => row.tx_hash as Hash))

      return Treasury.of({ send, sendMany, confirm, confirmMany, recorded, attempts, recover })
    })

  /** The treasury plus its recovery loop: at start, then every 5 s (docs/decisions.md D168). */
  static readonly layer = Layer.effect(
    Treasury,
    Effect.gen(function* () {
      const treasury = yield* Treasury.make()
      yield* repeatInBackground(treasury.recover, {
        every: "5 seconds",
        failure: "treasury recovery pass failed",
        level: "warning"
      })
      return treasury
    })
  )
}
