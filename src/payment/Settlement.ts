import { Clock, Context, Effect, Layer, Metric, Result, Semaphore } from "effect"
import { getAddress, type Hex } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Chain, type ChainError } from "../chain/Chain.ts"
import { Authorizations, type ClaimedAuthorization, type Landing } from "../ledger/Authorizations.ts"
import { Ledger, permit2NonceOf } from "../ledger/Ledger.ts"
import type { OutgoingTransfer } from "../ledger/Transfers.ts"
import { type Confirmed, Treasury } from "../ledger/Treasury.ts"

const RECOVER_EVERY_MS = 30_000
/**
 * Passes of the background loop that may be in flight at once (D426): a pass waits for its transfers'
 * block, so passes one after another drain at most a claim (`CLAIM_LIMIT`) per block; a new pass starts every 250 ms
 * while fewer than this many are waiting.
 */
export const MAX_PASSES = 4
/**
 * Unsigned rows' failures and doubtful rows' chain reads at once in a pass (rare paths: each is handled
 * alone). The pass's sends and landings are one batch each (D493); the treasury bounds its own gas
 * estimates and broadcasts across passes (`CHAIN_CALLS_AT_ONCE`), and one pass records its landings at a
 * time (D426: overlapping passes overlap their waits for blocks, not their chain and database work).
 */
const DOUBTS_AT_ONCE = 4
/**
 * How long before a payment's reservation (the database's clock) the token's events are read from for what
 * spent its nonce (D533): the chain's clock may run behind the database's.
 */
const CLOCK_SKEW_SECONDS = 600n
/** A look at what spent a nonce that takes longer is left to the next pass (D533), well inside a claim's 3 minutes. */
const JUDGE_TIMEOUT = "60 seconds"

/**
 * x402 payments failed for good on evidence that no payment can come (D533): the payer cancelled or spent the
 * nonce elsewhere, or it expired unused. Each is an answer served and not paid.
 */
export const x402Unpaid = Metric.counter("svc_x402_unpaid_total", {
  description:
    "x402 payments failed for good: the payer spent the nonce elsewhere or let it expire (answers not paid)",
  incremental: true
})

/** Settlement looks that could not tell whether money moved: the row is held and looked at again (D515, D533). */
export const x402Held = Metric.counter("svc_x402_settlements_held_total", {
  description:
    "x402 settlement looks left undecided (a transfer of ours open, the chain unread or inconclusive)",
  incremental: true
})

/** What a settlement whose money no live transfer of ours moved comes to (D533). */
type Verdict =
  /** The treasury was paid, by this transaction. */
  | { readonly _tag: "Paid"; readonly hash: Hex }
  /** Nothing moved, and the authorization may still be sent: back to the queue with its backoff. */
  | { readonly _tag: "Retry"; readonly reason: string }
  /** Evidence that the nonce can never pay us now: failed for good, the receipt says so. */
  | { readonly _tag: "Unpaid"; readonly reason: string }
  /** Not known (not read, or not conclusive): back to the queue, never failed; `slow`: a long backoff. */
  | { readonly _tag: "Held"; readonly reason: string; readonly slow?: boolean }

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
    const landing = yield* Semaphore.make(1)

    /**
     * Records landings in one statement, with their receipts' settlement facts, and queues those receipts
     * for the signer (D492).
     */
    const land = (landings: ReadonlyArray<Landing>) =>
      landings.length === 0
        ? Effect.void
        : Effect.gen(function* () {
            const landed = yield* authorizations.recordLanded(landings)
            yield* ledger.signLater(landed.receipts)
          }).pipe(landing.withPermit)

    /**
     * A row that can never be sent (no signature on record): back to the queue with its backoff, then failed
     * once our clock passes its `validBefore`, the receipt saying so (only while this claim holds the row).
     */
    const unsendable = (row: ClaimedAuthorization, reason: string) =>
      Effect.gen(function* () {
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const verdict: Verdict =
          BigInt(row.valid_before) <= BigInt(nowS) ? { _tag: "Unpaid", reason } : { _tag: "Retry", reason }
        yield* apply(row, verdict)
      })

    /**
     * Whether the authorization's nonce is spent: the token's record of it (Permit2's nonce bitmap for
     * `upto`). Spent is not paid: a payer can spend its own nonce (D533).
     */
    const nonceSpent = (row: ClaimedAuthorization) =>
      row.scheme === "upto"
        ? chain.permit2NonceUsed(getAddress(row.payer), permit2NonceOf(row.nonce))
        : chain.authorizationState(getAddress(row.payer), row.nonce as Hex)

    /**
     * What the transactions ever recorded for this authorization say, whatever their records say (a `void`
     * or `reverted` record is what one look found): one mined successfully paid; one still pooled may yet.
     * One the node does not know is neither: this is read only once no live record can pay (none is left,
     * the recovery rebroadcasting a live one the node lost, or the live one reverted), so it is a `void` one,
     * whose nonce another transaction of ours took, or the reverted one read from a node behind; holding a
     * row for it would hold it forever (a review's question, D533).
     */
    const attemptsOfOurs = (row: ClaimedAuthorization) =>
      Effect.gen(function* () {
        const hashes = yield* treasury.attempts(transferOf(row, (row.signature ?? "0x") as Hex))
        let open = false
        for (const hash of hashes) {
          const state = yield* chain.outgoing.state(hash)
          if (state._tag === "Mined" && state.status === "success") return { paid: hash, open }
          if (state._tag === "Pending") open = true
        }
        return { paid: undefined, open }
      })

    /**
     * What no live transfer of ours moving the money means (none was sent, or ours reverted or was replaced),
     * read from the chain and nothing written (D533). Unpaid for good only on evidence that the nonce can
     * never pay us now; anything not read, or read but not conclusive, is held.
     *
     * - Unspent: a failure (`reason`), retried; once the chain's own time is past `validBefore` the
     *   authorization can never be used, and it is unpaid.
     * - Spent, by a transaction ever recorded for it mined successfully: paid. One of ours still pooled: held.
     * - `upto`, spent otherwise: only the router signer can settle a permit (Permit2 binds it to its spender,
     *   the proxy; the proxy takes it only from the witness's facilitator, which the verifier requires to be
     *   the router signer), and every transaction of ours is recorded before it is broadcast, so the payer
     *   spent it (Permit2's `invalidateUnorderedNonces`, or another permit with the same nonce): unpaid.
     * - `exact`, spent otherwise: anyone may submit an EIP-3009 authorization, so the token's events decide:
     *   `AuthorizationUsed` with the transfer right after it to the treasury for the authorized value is a
     *   payment (someone else sent ours); `AuthorizationCanceled`, or the nonce's transfer anywhere else, is
     *   unpaid; no event found is held, with a long backoff.
     */
    const judge = (row: ClaimedAuthorization, reason: string): Effect.Effect<Verdict> =>
      Effect.gen(function* () {
        if (!(yield* nonceSpent(row))) {
          const nowS = BigInt(Math.floor((yield* Clock.currentTimeMillis) / 1000))
          if (BigInt(row.valid_before) > nowS) return { _tag: "Retry", reason } as const
          // Expired by our clock: the chain's own time says whether it can still be used.
          return (yield* chain.headTimestamp()) >= BigInt(row.valid_before)
            ? ({ _tag: "Unpaid", reason: `expired unused (${reason})` } as const)
            : ({ _tag: "Held", reason: `${reason}; the chain's time is not yet past validBefore` } as const)
        }
        const ours = yield* attemptsOfOurs(row)
        if (ours.paid !== undefined) return { _tag: "Paid", hash: ours.paid } as const
        if (ours.open)
          return { _tag: "Held", reason: "the nonce is spent; a transfer of ours is still pooled" } as const
        if (row.scheme === "upto")
          return {
            _tag: "Unpaid",
            reason: "the payer spent the Permit2 nonce (no settlement of ours did)"
          } as const
        const fate = yield* chain.authorizationFate(
          getAddress(row.payer),
          row.nonce as Hex,
          BigInt(row.reserved_at) - CLOCK_SKEW_SECONDS
        )
        if (fate === undefined)
          return {
            _tag: "Held",
            reason: "the nonce is spent; no event of its use found yet",
            slow: true
          } as const
        if (
          fate._tag === "Transferred" &&
          fate.to.toLowerCase() === chain.treasury.toLowerCase() &&
          fate.value === BigInt(row.value)
        )
          return { _tag: "Paid", hash: fate.txHash } as const
        return {
          _tag: "Unpaid",
          reason:
            fate._tag === "Canceled"
              ? `the payer cancelled the authorization (${fate.txHash})`
              : fate._tag === "Transferred"
                ? `the nonce moved ${fate.value} to ${fate.to} in ${fate.txHash}, not this authorization's ${row.value} to the treasury`
                : `the nonce was used without a transfer out of the payer's wallet (${fate.txHash})`
        } as const
      }).pipe(
        Effect.timeoutOrElse({
          duration: JUDGE_TIMEOUT,
          orElse: () =>
            Effect.succeed<Verdict>({
              _tag: "Held",
              reason: "the look at what spent the nonce took too long"
            })
        }),
        Effect.catchTag("ChainError", (e) =>
          Effect.succeed<Verdict>({ _tag: "Held", reason: `${reason}; then ${e.reason}: ${e.message}` })
        )
      )

    /**
     * Writes a verdict, whole (uninterruptible): the row back to the queue, or failed for good with its
     * receipt saying so (only while this claim holds the row). Returns the hash to land the row with.
     */
    const apply = (row: ClaimedAuthorization, verdict: Verdict): Effect.Effect<Hex | undefined> =>
      Effect.uninterruptible(
        Effect.gen(function* () {
          if (verdict._tag === "Paid") return verdict.hash
          const final = verdict._tag === "Unpaid"
          if (final) yield* Metric.update(x402Unpaid, 1)
          if (verdict._tag === "Held") yield* Metric.update(x402Held, 1)
          const holds = yield* authorizations.recordFailed(row, verdict.reason, {
            final,
            slow: verdict._tag === "Held" && verdict.slow === true
          })
          yield* Effect.logWarning(
            verdict._tag === "Held"
              ? "settlement undecided; left to the next pass"
              : "settlement attempt failed",
            { request_id: row.request_id, reason: verdict.reason, final }
          )
          if (final && holds) yield* ledger.finalizeReceipt(row.request_id, { settlement: "failed" })
          return undefined
        })
      )

    const notMovedByUs = (row: ClaimedAuthorization, reason: string) =>
      Effect.flatMap(judge(row, reason), (verdict) => apply(row, verdict))

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

    /**
     * Nothing recorded for this authorization (a refused estimate), or a wait that failed. A live transaction
     * of ours is looked at: mined successfully, it paid; still open, the row waits for it (D515); reverted, it
     * moved nothing, and what spent the nonce decides (`notMovedByUs`). Returns the hash to record the landing
     * with; none: nothing landed (a failure is recorded, or a transaction of ours is still open, which the
     * next pass confirms).
     */
    const unresolved = (row: ClaimedAuthorization, e: ChainError) =>
      Effect.gen(function* () {
        const ours = yield* treasury.recorded(transferOf(row, (row.signature ?? "0x") as Hex))
        if (ours === undefined) return yield* notMovedByUs(row, `${e.reason}: ${e.message}`)
        const state = yield* Effect.result(chain.outgoing.state(ours))
        if (Result.isSuccess(state) && state.success._tag === "Mined") {
          if (state.success.status === "success") return ours
          return yield* notMovedByUs(row, `transfer ${ours} reverted`)
        }
        // A live transaction of ours (signed, broadcast, or its state unread) can still move the money: the
        // row is never failed for it, even past validBefore (D515). It goes back to the queue with its
        // backoff; the next pass's send adopts the same transaction and confirms it.
        return yield* apply(row, {
          _tag: "Held",
          reason: `transfer ${ours} still open: ${e.reason}: ${e.message}`
        })
      })

    /** How a sent row's transfer ended: the hash its landing is recorded with, or none. */
    const settledBy = (row: ClaimedAuthorization, hash: Hex, confirmed: Confirmed) =>
      Result.isFailure(confirmed)
        ? unresolved(row, confirmed.failure)
        : confirmed.success.status === "success"
          ? Effect.succeed<Hex | undefined>(hash)
          : notMovedByUs(row, `transfer ${confirmed.success.status}`)

    const landingsOf = (pairs: ReadonlyArray<readonly [ClaimedAuthorization, Hex | undefined]>) =>
      pairs.flatMap(([row, hash]): Array<Landing> => (hash === undefined ? [] : [{ row, hash }]))

    // A claim is stale after 3 minutes (`Authorizations.recover`): looking every 30 s, not on every
    // 250 ms pass, spares the database four statements a second that almost always change nothing.
    let recoveredAt = Number.NEGATIVE_INFINITY
    /**
     * One pass (D493): its claimed rows are sent together (`Treasury.sendMany`: one record transaction, the
     * sender's row locked once), their hashes recorded in one statement, then all confirmed together (one
     * look per block for the pass) and their landings recorded in one statement. Every claimed row is sent
     * before any is waited for (D451): the transfers of one pass go to the chain together (one block where
     * blocks are timed) and their waits overlap. A row whose send or wait fails is handled alone, as before.
     */
    const runOnce = Effect.gen(function* () {
      const nowMs = yield* Clock.currentTimeMillis
      if (nowMs - recoveredAt >= RECOVER_EVERY_MS) {
        recoveredAt = nowMs
        yield* authorizations.recover
      }
      const rows = yield* authorizations.claimDue
      if (rows.length === 0) return 0
      const unsigned = rows.filter((row) => row.signature === null)
      yield* Effect.forEach(unsigned, (row) => unsendable(row, "no signature on record"), {
        concurrency: DOUBTS_AT_ONCE,
        discard: true
      })
      const signed = rows.filter((row) => row.signature !== null)
      const sends = yield* treasury.sendMany(signed.map((row) => transferOf(row, row.signature as Hex)))
      const sent: Array<Landing> = []
      const refused: Array<readonly [ClaimedAuthorization, ChainError]> = []
      for (const [i, row] of signed.entries()) {
        const result = sends[i]!
        if (Result.isSuccess(result)) sent.push({ row, hash: result.success })
        else refused.push([row, result.failure])
      }
      yield* authorizations.recordBroadcast(sent.filter(({ row, hash }) => row.tx_hash !== hash))
      // The refused rows are looked into beside the sent ones' waits, not before them: a look at what spent
      // a nonce may read the chain for a while (D533), and holds back no fresh row's landing.
      const doubts = Effect.forEach(
        refused,
        ([row, e]) => Effect.map(unresolved(row, e), (hash) => [row, hash] as const),
        { concurrency: DOUBTS_AT_ONCE }
      ).pipe(Effect.flatMap((decided) => land(landingsOf(decided))))
      // Each look's finished transfers land together as soon as that look is written (D516): one transfer
      // still pending (its fees refused, a gap below it) holds back no other's landing.
      const settleAll = (finished: ReadonlyArray<readonly [Landing, Confirmed]>) =>
        Effect.forEach(
          finished,
          ([{ row, hash }, confirmed]) =>
            Effect.map(settledBy(row, hash, confirmed), (landed) => [row, landed] as const),
          { concurrency: DOUBTS_AT_ONCE }
        ).pipe(Effect.flatMap((settled) => land(landingsOf(settled))))
      const handed = new Set<string>()
      const [, confirmed] = yield* Effect.all(
        [
          doubts,
          treasury.confirmMany(
            sent.map(({ hash }) => hash),
            (finished) => {
              const hashes = new Map(
                finished.map(([hash, outcome]) => [hash.toLowerCase(), outcome] as const)
              )
              const now = sent.filter(
                ({ hash }) => hashes.has(hash.toLowerCase()) && !handed.has(hash.toLowerCase())
              )
              for (const { hash } of now) handed.add(hash.toLowerCase())
              return settleAll(
                now.map((landing) => [landing, hashes.get(landing.hash.toLowerCase())!] as const)
              )
            }
          )
        ],
        { concurrency: 2 }
      )
      // Whatever the treasury did not hand over (none, as it keeps its word) lands from its answer.
      yield* settleAll(
        sent.flatMap((landing, i) =>
          handed.has(landing.hash.toLowerCase()) ? [] : [[landing, confirmed[i]!] as const]
        )
      )
      yield* Effect.annotateCurrentSpan({ claimed: rows.length, sent: sent.length })
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
