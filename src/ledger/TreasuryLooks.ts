import { type Duration, Effect, Result, type Semaphore } from "effect"
import { getAddress, type Hash, type Hex } from "viem"
import type { ChainError, ChainShape, TransactionState } from "../chain/Chain.ts"
import type { TransferOutcome } from "./Transfers.ts"
import {
  compareNonces,
  groupBy,
  type Offered,
  type Recorded,
  type TreasuryRecords
} from "./TreasuryRecords.ts"

/**
 * The treasury's looks at the chain (`Treasury.ts`): offering recorded bytes, reading open transactions'
 * states, resolving them from one look (written through `TreasuryRecords`), filling nonce gaps, and
 * waiting for the next block.
 */

/**
 * Most poll intervals a confirm waits for a new block before it looks at its transaction again (D452): with
 * blocks a second apart (a paced embedded chain, D450) a look every 100 ms cost each waiting settlement
 * two RPCs and a statement ten times a block.
 */
export const HEAD_WAIT_POLLS = 10

/** Where an open transaction stands after one look at the chain. */
type Resolution = TransferOutcome | { readonly status: "pending" }

/** What one look at the chain found for a transaction, before anything is written. */
type Look =
  | { readonly _tag: "Mined"; readonly state: Extract<TransactionState, { _tag: "Mined" }> }
  | { readonly _tag: "Pending" }
  | { readonly _tag: "Replaced" }
  /** Unknown to the node and its nonce still free: offered again. */
  | { readonly _tag: "Offer" }

export type TreasuryLooks = ReturnType<typeof makeTreasuryLooks>

export interface TreasuryLooksOptions {
  readonly chain: ChainShape
  readonly records: TreasuryRecords
  /** Gas estimates and broadcasts in flight at once, shared with the sends (`CHAIN_CALLS_AT_ONCE`). */
  readonly chainCalls: Semaphore.Semaphore
  /** The chain's head, asked at most once a poll interval however many confirms wait (D452). */
  readonly head: Effect.Effect<bigint, ChainError>
  readonly pollInterval: Duration.Duration
  /** Blocks a receipt must be deep before a transfer counts as final (at least 1). */
  readonly confirmations: number
}

export const makeTreasuryLooks = ({
  chain,
  records,
  chainCalls,
  head,
  pollInterval,
  confirmations
}: TreasuryLooksOptions) => {
  const { distrustNonce, noteOffers, finalizeAll, openBelow } = records

  /**
   * Waits until the chain has a block past `seen` (a look at a pending transaction before then would
   * find it as it was), or `HEAD_WAIT_POLLS` intervals have passed: a transaction that no block will
   * take (a gap below it, a lost broadcast) is looked at again, and offered again, all the same.
   */
  const blockAfter = (seen: bigint | undefined) =>
    Effect.gen(function* () {
      for (let poll = 0; poll < HEAD_WAIT_POLLS; poll++) {
        yield* Effect.sleep(pollInterval)
        if (seen === undefined) return
        const now = yield* Effect.option(head)
        if (now._tag === "None" || now.value > seen) return
      }
    })

  /**
   * Offers the recorded bytes to the node. A refusal or an unreachable node is answered, not raised: the
   * transaction is recorded, and `confirm` and the recovery loop offer it again.
   */
  const offer = (record: Recorded): Effect.Effect<Offered> =>
    chainCalls.withPermit(chain.outgoing.broadcast(record.raw_tx as Hex)).pipe(
      // A used nonce may be this very transaction, mined: resolving the record tells which. Either
      // way the sender's kept nonce is in doubt until the node is asked again.
      Effect.tap((result) => (result === "accepted" ? Effect.void : distrustNonce(record.sender))),
      Effect.catchTag("ChainError", (e) =>
        Effect.as(
          Effect.logWarning("transaction recorded but not broadcast; it will be offered again", {
            purpose: record.purpose,
            tx_hash: record.tx_hash,
            error: e.message
          }),
          { error: e.message }
        )
      )
    )

  /**
   * Offers records, each sender's one at a time in nonce order (senders at once): a node or sequencer that
   * refuses nonce gaps would refuse a higher nonce offered before a lower one ("nonce too high"). One
   * answer per record, in the order given.
   */
  const offerInOrder = (records: ReadonlyArray<Recorded>) =>
    Effect.gen(function* () {
      const answers = new Map<Recorded, Offered>()
      yield* Effect.forEach(
        groupBy(records, (record) => record.sender),
        ([, own]) =>
          Effect.forEach(
            [...own].sort((a, b) => compareNonces(a.nonce, b.nonce)),
            (record) =>
              Effect.map(offer(record), (answer) => {
                answers.set(record, answer)
              }),
            { discard: true }
          ),
        { concurrency: "unbounded", discard: true }
      )
      return records.map((record) => answers.get(record)!)
    })

  const broadcast = (record: Recorded) =>
    Effect.tap(offer(record), (offered) => noteOffers([[record, offered]]))

  /**
   * One look at open transactions: every state read in the same turn. Unknown to the node: if the
   * sender's mined count (asked once per sender) has passed its nonce, another transaction took that
   * nonce and this one can never be mined (`Replaced`); otherwise the same bytes are offered again. The
   * count is read before the hash is looked up again, so a transaction mined in between is seen as
   * mined, never as replaced.
   */
  const lookAll = (records: ReadonlyArray<Recorded>) =>
    Effect.gen(function* () {
      const states = yield* Effect.forEach(
        records,
        (record) => Effect.result(chain.outgoing.state(record.tx_hash as Hash)),
        { concurrency: "unbounded" }
      )
      const unknownSenders = new Set(
        records.filter((_, i) => Result.getOrUndefined(states[i]!)?._tag === "Unknown").map((r) => r.sender)
      )
      const minedCounts = new Map(
        yield* Effect.forEach(
          unknownSenders,
          (sender) =>
            Effect.map(
              Effect.result(chain.outgoing.minedNonce(getAddress(sender))),
              (n) => [sender, n] as const
            ),
          { concurrency: "unbounded" }
        )
      )
      return yield* Effect.forEach(
        records,
        (record, i): Effect.Effect<Result.Result<Look, ChainError>> =>
          Effect.gen(function* () {
            const state = states[i]!
            if (Result.isFailure(state)) return Result.fail(state.failure)
            if (state.success._tag === "Mined") return Result.succeed({ _tag: "Mined", state: state.success })
            if (state.success._tag === "Pending") return Result.succeed({ _tag: "Pending" })
            const mined = minedCounts.get(record.sender)!
            if (Result.isFailure(mined)) return Result.fail(mined.failure)
            if (mined.success <= Number(record.nonce)) return Result.succeed({ _tag: "Offer" })
            const again = yield* Effect.result(chain.outgoing.state(record.tx_hash as Hash))
            if (Result.isFailure(again)) return Result.fail(again.failure)
            return Result.succeed(
              again.success._tag === "Mined" ? { _tag: "Mined", state: again.success } : { _tag: "Replaced" }
            )
          }),
        { concurrency: "unbounded" }
      )
    })

  /**
   * Resolves open transactions from one look (`lookAll`): mined deep enough or replaced ones are final
   * (one statement for them all), pending ones stay open (a `signed` one seen in the pool is noted
   * `broadcast`), unknown ones are offered again; the offers and notes are one statement.
   */
  const resolveAll = (records: ReadonlyArray<Recorded>) =>
    Effect.gen(function* () {
      const looks = yield* lookAll(records)
      // Depth is counted from one head read for the whole look (no read at all for one confirmation).
      const needsHead =
        confirmations > 1 && looks.some((look) => Result.getOrUndefined(look)?._tag === "Mined")
      const latest = needsHead ? yield* Effect.result(chain.blockNumber()) : undefined
      const finals: Array<readonly [Recorded, TransferOutcome]> = []
      const notes: Array<readonly [Recorded, Offered]> = []
      const offers: Array<Recorded> = []
      const resolutionOf = (record: Recorded, look: Look): Result.Result<Resolution, ChainError> => {
        if (look._tag === "Pending") {
          if (record.status === "signed") notes.push([record, "accepted"])
          return Result.succeed({ status: "pending" })
        }
        if (look._tag === "Offer") {
          offers.push(record)
          return Result.succeed({ status: "pending" })
        }
        if (look._tag === "Replaced") {
          finals.push([record, { status: "replaced" }])
          return Result.succeed({ status: "replaced" })
        }
        const { status, blockNumber } = look.state
        if (latest !== undefined) {
          if (Result.isFailure(latest)) return Result.fail(latest.failure)
          if (latest.success - blockNumber + 1n < BigInt(confirmations))
            return Result.succeed({ status: "pending" })
        }
        finals.push([record, { status, blockNumber }])
        return Result.succeed({ status, blockNumber })
      }
      const resolutions = looks.map((look, i) =>
        Result.isFailure(look) ? Result.fail(look.failure) : resolutionOf(records[i]!, look.success)
      )
      const offered = yield* offerInOrder(offers)
      yield* noteOffers([...notes, ...offers.map((record, i) => [record, offered[i]!] as const)])
      yield* finalizeAll(finals)
      return resolutions
    })

  const resolve = (record: Recorded) =>
    Effect.flatMap(resolveAll([record]), ([resolution]) => Effect.fromResult(resolution!))

  /**
   * A transaction waits for every lower nonce of its sender: when one of those is unknown to the node
   * (its broadcast lost), it can sit in the pool forever. For each sender of the still pending `waiting`,
   * its open transactions below the highest of them are looked at, lowest first, offering those bytes
   * again to fill the gap (docs/decisions.md D169). The look stops at the first one still pending (in the
   * pool, or just offered again: the ones above it wait on it, and are looked at once it mines, D427),
   * or at one of `ours` (looked at in this very look). One select per sender (D491). Returns the error
   * that stopped a sender's look, by sender.
   */
  const fillGapsBelow = (waiting: ReadonlyArray<Recorded>, ours: ReadonlySet<string>) =>
    Effect.gen(function* () {
      const failed = new Map<string, ChainError>()
      for (const [sender, open] of groupBy(waiting, (record) => record.sender)) {
        const highest = open.reduce(
          (max, record) => (BigInt(record.nonce) > max ? BigInt(record.nonce) : max),
          0n
        )
        const filled = yield* Effect.result(
          Effect.gen(function* () {
            const below = yield* openBelow(sender, highest)
            for (const earlier of below) {
              if (ours.has(earlier.id)) return
              if ((yield* resolve(earlier)).status === "pending") return
            }
          })
        )
        if (Result.isFailure(filled)) failed.set(sender, filled.failure)
      }
      return failed
    })

  /**
   * Whether a just-recorded transaction the node refused `nonceUsed` is void: the careful look of
   * `resolve` (mined count past its nonce, and its hash still not mined). Any doubt (pending, mined, the
   * node unreachable) answers false and the record stays for `confirm` and recovery.
   */
  const voidedNow = (record: Recorded) =>
    resolve(record).pipe(
      Effect.map((resolution) => resolution.status === "replaced"),
      Effect.orElseSucceed(() => false)
    )

  return { blockAfter, offer, offerInOrder, broadcast, resolveAll, resolve, fillGapsBelow, voidedNow }
}
