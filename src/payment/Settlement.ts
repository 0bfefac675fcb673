import { Clock, Context, Effect, Layer, Result, Semaphore } from "effect"
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
    // whether it is used. Used with no transaction of ours means someone else submitted it. Returns the
    // hash to record its landing with; none: nothing landed (a failure is recorded, or a transaction of
    // ours is still open, which the next pass confirms).
    const unresolved = (row: ClaimedAuthorization, e: ChainError) =>
      Effect.gen(function* () {
        const ours = yield* treasury.recorded(transferOf(row, (row.signature ?? "0x") as Hex))
        const used = yield* alreadyUsed(row).pipe(Effect.orElseSucceed(() => false))
        if (used) return (ours ?? row.tx_hash ?? "unknown") as Hex
        if (ours !== undefined) {
          // A live transaction of ours (signed, broadcast, or mined while the token's answer was lost) can
          // still move the money: the row is never failed for it, even past validBefore (D515). It goes back
          // to the queue with its backoff; the next pass's send adopts the same transaction and confirms it.
          yield* authorizations.recordFailed(
            row,
            `transfer ${ours} still open: ${e.reason}: ${e.message}`,
            false
          )
          yield* Effect.logWarning("settlement left to the next pass: our transfer is still open", {
            request_id: row.request_id,
            tx_hash: ours,
            reason: e.reason
          })
          return undefined
        }
        yield* failed(row, `${e.reason}: ${e.message}`)
        return undefined
      })

    /** How a sent row's transfer ended: the hash its landing is recorded with, or none. */
    const settledBy = (row: ClaimedAuthorization, hash: Hex, confirmed: Confirmed) =>
      Effect.gen(function* () {
        if (Result.isFailure(confirmed)) return yield* unresolved(row, confirmed.failure)
        if (confirmed.success.status === "success") return hash
        // Moved nothing; the token says whether another submission (not ours) used the authorization.
        if (yield* alreadyUsed(row)) return (row.tx_hash ?? hash) as Hex
        yield* failed(row, `transfer ${confirmed.success.status}`)
        return undefined
      }).pipe(Effect.catchTag("ChainError", (e) => unresolved(row, e)))

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
      yield* Effect.forEach(unsigned, (row) => failed(row, "no signature on record"), {
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
      const doubts = yield* Effect.forEach(
        refused,
        ([row, e]) => Effect.map(unresolved(row, e), (hash) => [row, hash] as const),
        { concurrency: DOUBTS_AT_ONCE }
      )
      yield* land(landingsOf(doubts))
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
      const confirmed = yield* treasury.confirmMany(
        sent.map(({ hash }) => hash),
        (finished) => {
          const hashes = new Map(finished.map(([hash, outcome]) => [hash.toLowerCase(), outcome] as const))
          const now = sent.filter(
            ({ hash }) => hashes.has(hash.toLowerCase()) && !handed.has(hash.toLowerCase())
          )
          for (const { hash } of now) handed.add(hash.toLowerCase())
          return settleAll(now.map((landing) => [landing, hashes.get(landing.hash.toLowerCase())!] as const))
        }
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
