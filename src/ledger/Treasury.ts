import { Clock, Context, Duration, Effect, Layer, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, type Hash, type Hex } from "viem"
import { repeatInBackground } from "../Background.ts"
import {
  type BroadcastResult,
  Chain,
  ChainError,
  type OutgoingCall,
  type TransactionState
} from "../chain/Chain.ts"
import { attributes, type OutgoingTransfer, purposeOf, type TransferOutcome } from "./Transfers.ts"

/** A row of `outgoing_transactions`. */
const Recorded = Schema.Struct({
  id: Schema.String,
  purpose: Schema.String,
  sender: Schema.String,
  nonce: Schema.String,
  tx_hash: Schema.String,
  raw_tx: Schema.String,
  to_address: Schema.String,
  call_data: Schema.String,
  status: Schema.Literals(["signed", "broadcast", "mined", "reverted", "void"]),
  block_number: Schema.NullOr(Schema.String)
})
type Recorded = typeof Recorded.Type
const decodeRecorded = Schema.decodeUnknownEffect(Schema.Array(Recorded))

/**
 * Most poll intervals a confirm waits for a new block before it looks at its transaction again (D452): with
 * blocks a second apart (a paced embedded chain, D450) a look every 100 ms cost each waiting settlement
 * two RPCs and a statement ten times a block.
 */
export const HEAD_WAIT_POLLS = 10

/** How long one answer of the node's mined count backs the kept nonce of a sender (D331). */
export const NONCE_TRUST_MS = 30_000

const COLUMNS =
  "id::text AS id, purpose, sender, nonce::text AS nonce, tx_hash, raw_tx, to_address, call_data, status, block_number::text AS block_number"

export interface TreasuryOptions {
  /** Blocks a receipt must be deep before a transfer counts as final (1: its own block). */
  readonly confirmations?: number
  /** How long `confirm` waits for a transfer to be final before failing `Timeout` (it stays recorded). */
  readonly confirmTimeout?: Duration.Input
  /** Between two looks at a transaction that is not yet mined. */
  readonly pollInterval?: Duration.Input
}

/** Where an open transaction stands after one look at the chain. */
type Resolution = TransferOutcome | { readonly status: "pending" }

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
   * Waits until a sent transfer is final, rebroadcasting its recorded bytes while the node does not know
   * it. Fails `Timeout` after `confirmTimeout` (the transfer stays recorded; the recovery loop goes on).
   */
  readonly confirm: (hash: Hash) => Effect.Effect<TransferOutcome, ChainError>
  /** The live transaction recorded for this transfer's purpose, if any. */
  readonly recorded: (transfer: OutgoingTransfer) => Effect.Effect<Hash | undefined>
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

      // The chain's head, asked at most once a poll interval however many confirms wait (D452).
      const head = yield* Effect.cachedWithTTL(chain.blockNumber(), pollInterval)
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

      const callOf = (transfer: OutgoingTransfer): Effect.Effect<OutgoingCall, ChainError> => {
        switch (transfer._tag) {
          case "X402Settlement":
            return Effect.succeed(chain.calls.transferWithAuthorization(transfer.authorization))
          case "UptoSettlement":
            return Effect.succeed(chain.calls.uptoSettlement(transfer.permit, transfer.amount))
          case "RefundBatch":
          case "ProviderPayout":
          case "Withdrawal":
            return Effect.succeed(chain.calls.treasuryTransfer(transfer.to, transfer.amount))
          case "EpochAnchor":
            return chain.calls.anchor(transfer.epochId, transfer.root)
        }
      }

      const decoded = <E, R>(rows: Effect.Effect<ReadonlyArray<unknown>, E, R>) =>
        rows.pipe(Effect.flatMap(decodeRecorded), Effect.orDie)

      const liveFor = (purpose: string) =>
        decoded(
          sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions
              WHERE purpose = ${purpose} AND status IN ('signed', 'broadcast', 'mined')`
        ).pipe(Effect.map((rows) => rows[0]))

      /** The same purpose must always mean the same call: anything else is a bug, never a second transfer. */
      const requireSameCall = (record: Recorded, call: OutgoingCall) =>
        record.to_address === call.to.toLowerCase() &&
        record.call_data === call.data.toLowerCase() &&
        record.sender === call.from.toLowerCase()
          ? Effect.void
          : Effect.die(new Error(`purpose ${record.purpose} is recorded with another transfer`))

      /**
       * Takes the sender's next nonce under its row lock, signs, and records the signed bytes, all in one
       * database transaction: the nonce is spent exactly when the record exists. The nonce is the higher of
       * the lowest one no record holds and the chain's mined count (a transaction sent by someone else).
       */
      // Senders whose row a committed transaction of this process wrote or found: rows are never deleted,
      // so their insert is not sent again (one statement fewer in every send's transaction).
      const knownSenders = new Set<string>()
      // When this process last asked the node for a sender's mined count (Clock ms), per sender. Within
      // `NONCE_TRUST_MS` of that ask and with no doubt since, the kept `next_nonce` is authoritative: every
      // nonce of the sender is handed out under its row lock, and the ask put the kept one at or above the
      // chain's count. A nonce found taken (a broadcast refused `nonceUsed`, a record voided) drops the
      // sender from here, so the next send asks the node again (docs/decisions.md D331).
      const nonceAskedAt = new Map<string, number>()
      const distrustNonce = (sender: string) => Effect.sync(() => nonceAskedAt.delete(sender.toLowerCase()))
      const signAndRecord = (
        purpose: string,
        kind: string,
        call: OutgoingCall,
        plan: Parameters<typeof chain.outgoing.sign>[1]
      ) =>
        sql
          .withTransaction(
            Effect.gen(function* () {
              const sender = call.from.toLowerCase()
              if (!knownSenders.has(sender))
                yield* sql`INSERT INTO treasury_senders (address, next_nonce) VALUES (${sender}, 0)
                         ON CONFLICT (address) DO NOTHING`
              const [lock] = yield* sql<{ next_nonce: string }>`
              SELECT next_nonce::text AS next_nonce FROM treasury_senders WHERE address = ${sender} FOR UPDATE`
              // Another instance may have recorded this purpose while we waited for the lock.
              const raced = yield* liveFor(purpose)
              if (raced !== undefined) return { row: raced, askedAt: undefined }
              const kept = Number(lock?.next_nonce ?? 0)
              const now = yield* Clock.currentTimeMillis
              const askedAt = nonceAskedAt.get(sender)
              const trusted = askedAt !== undefined && now >= askedAt && now - askedAt < NONCE_TRUST_MS
              const nonce = trusted ? kept : Math.max(kept, yield* chain.outgoing.minedNonce(call.from))
              const signed = yield* chain.outgoing.sign(call, plan, nonce)
              // The record and the sender's next nonce in one statement (D332): a data-modifying CTE runs
              // exactly once whether or not it is read, and fails or commits with the insert.
              const [row] = yield* sql`
              WITH kept AS (
                UPDATE treasury_senders SET next_nonce = ${nonce + 1}, updated_at = now() WHERE address = ${sender}
              )
              INSERT INTO outgoing_transactions (purpose, kind, sender, nonce, tx_hash, raw_tx, to_address, call_data, status)
              VALUES (${purpose}, ${kind}, ${sender}, ${nonce}, ${signed.hash}, ${signed.raw},
                      ${call.to.toLowerCase()}, ${call.data.toLowerCase()}, 'signed')
              RETURNING ${sql.literal(COLUMNS)}`.pipe(Effect.flatMap(decodeRecorded), Effect.orDie)
              return { row: row!, askedAt: trusted ? undefined : now }
            })
          )
          .pipe(
            // After commit only: a rolled-back transaction may leave the kept nonce below what the node said.
            Effect.map((recorded) => {
              const sender = call.from.toLowerCase()
              knownSenders.add(sender)
              if (recorded.askedAt !== undefined) nonceAskedAt.set(sender, recorded.askedAt)
              return recorded.row
            })
          )

      const noteBroadcast = (record: Recorded, error: string | undefined) =>
        (error === undefined
          ? sql`UPDATE outgoing_transactions
                SET status = 'broadcast', broadcasts = broadcasts + 1, last_error = NULL, updated_at = now()
                WHERE id = ${record.id} AND status IN ('signed', 'broadcast')`
          : sql`UPDATE outgoing_transactions SET last_error = ${error.slice(0, 300)}, updated_at = now()
                WHERE id = ${record.id} AND status IN ('signed', 'broadcast')`
        ).pipe(Effect.asVoid, Effect.orDie)

      /**
       * Offers the recorded bytes to the node. A refusal or an unreachable node is noted, not raised: the
       * transaction is recorded, and `confirm` and the recovery loop offer it again.
       */
      const broadcast = (record: Recorded): Effect.Effect<BroadcastResult | "failed"> =>
        chain.outgoing.broadcast(record.raw_tx as Hex).pipe(
          Effect.tap((result) =>
            // A used nonce may be this very transaction, mined: resolving the record tells which. Either
            // way the sender's kept nonce is in doubt until the node is asked again.
            result === "accepted" ? noteBroadcast(record, undefined) : distrustNonce(record.sender)
          ),
          Effect.catchTag("ChainError", (e) =>
            Effect.as(
              Effect.andThen(
                noteBroadcast(record, e.message),
                Effect.logWarning("transaction recorded but not broadcast; it will be offered again", {
                  purpose: record.purpose,
                  tx_hash: record.tx_hash,
                  error: e.message
                })
              ),
              "failed" as const
            )
          )
        )

      const finalize = (record: Recorded, outcome: TransferOutcome) =>
        sql`UPDATE outgoing_transactions
            SET status = ${outcome.status === "success" ? "mined" : outcome.status === "reverted" ? "reverted" : "void"},
                block_number = ${outcome.status === "replaced" ? null : outcome.blockNumber.toString()},
                updated_at = now()
            WHERE id = ${record.id} AND status IN ('signed', 'broadcast')`.pipe(
          Effect.orDie,
          Effect.andThen(outcome.status === "replaced" ? distrustNonce(record.sender) : Effect.void),
          Effect.tap(() =>
            outcome.status === "success"
              ? Effect.void
              : Effect.logWarning("outgoing transaction moved nothing", {
                  purpose: record.purpose,
                  tx_hash: record.tx_hash,
                  outcome: outcome.status
                })
          ),
          Effect.as(outcome)
        )

      const outcomeOf = (record: Recorded): TransferOutcome | undefined =>
        record.status === "mined"
          ? { status: "success", blockNumber: BigInt(record.block_number ?? "0") }
          : record.status === "reverted"
            ? { status: "reverted", blockNumber: BigInt(record.block_number ?? "0") }
            : record.status === "void"
              ? { status: "replaced" }
              : undefined

      const deepEnough = (blockNumber: bigint) =>
        confirmations <= 1
          ? Effect.succeed(true)
          : Effect.map(chain.blockNumber(), (latest) => latest - blockNumber + 1n >= BigInt(confirmations))

      const minedOutcome = (record: Recorded, state: Extract<TransactionState, { _tag: "Mined" }>) =>
        Effect.flatMap(
          deepEnough(state.blockNumber),
          (deep): Effect.Effect<Resolution> =>
            deep
              ? finalize(record, { status: state.status, blockNumber: state.blockNumber })
              : Effect.succeed({ status: "pending" })
        )

      /**
       * One look at an open transaction. Unknown to the node: if the sender's mined count has passed its
       * nonce, another transaction took that nonce and this one can never be mined (`void`); otherwise the
       * same bytes are broadcast again. The count is read before the hash is looked up again, so a
       * transaction mined in between is seen as mined, never as replaced.
       */
      const resolve = (record: Recorded): Effect.Effect<Resolution, ChainError> =>
        Effect.gen(function* () {
          const state = yield* chain.outgoing.state(record.tx_hash as Hash)
          if (state._tag === "Mined") return yield* minedOutcome(record, state)
          if (state._tag === "Pending") {
            if (record.status === "signed") yield* noteBroadcast(record, undefined)
            return { status: "pending" } as const
          }
          const mined = yield* chain.outgoing.minedNonce(getAddress(record.sender))
          if (mined > Number(record.nonce)) {
            const again = yield* chain.outgoing.state(record.tx_hash as Hash)
            if (again._tag === "Mined") return yield* minedOutcome(record, again)
            return yield* finalize(record, { status: "replaced" })
          }
          yield* broadcast(record)
          return { status: "pending" } as const
        })

      /**
       * A transaction waits for every lower nonce of its sender: when one of those is unknown to the node
       * (its broadcast lost), this one can sit in the pool forever. Looking at the sender's open
       * transactions below it, lowest first, offers those bytes again and fills the gap (docs/decisions.md
       * D169). The look stops at the first one still pending (in the pool, or just offered again): the ones
       * above it wait on it, and are looked at once it mines (D427). Looking at every lower one cost a look
       * per pair with a settlement pass's confirms all waiting at once, about 120 chain reads a pass.
       */
      const fillGapBelow = (record: Recorded) =>
        Effect.gen(function* () {
          const below = yield* decoded(
            sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions
                WHERE sender = ${record.sender} AND nonce < ${record.nonce} AND status IN ('signed', 'broadcast')
                ORDER BY outgoing_transactions.nonce`
          )
          for (const earlier of below) if ((yield* resolve(earlier)).status === "pending") return
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

      const send = (transfer: OutgoingTransfer) =>
        Effect.gen(function* () {
          const purpose = purposeOf(transfer)
          const call = yield* callOf(transfer)
          const existing = yield* liveFor(purpose)
          if (existing !== undefined) {
            yield* requireSameCall(existing, call)
            if (existing.status !== "mined") yield* broadcast(existing)
            yield* Effect.annotateCurrentSpan({ adopted: true, tx_hash: existing.tx_hash })
            return existing.tx_hash as Hash
          }
          // Estimated before the lock is taken: a call that would revert is refused with nothing signed.
          const plan = yield* chain.outgoing.plan(call)
          const recordNew = signAndRecord(purpose, transfer._tag, call, plan).pipe(
            Effect.catchTag("SqlError", (e) => Effect.die(e)),
            Effect.tap((record) => requireSameCall(record, call))
          )
          let record = yield* recordNew
          if ((yield* broadcast(record)) === "nonceUsed" && (yield* voidedNow(record))) {
            // Its nonce was taken by a transaction not ours (D331): the record is void and can never be
            // mined, so the purpose is signed once more, with a nonce the node has just been asked for.
            record = yield* recordNew
            yield* broadcast(record)
          }
          yield* Effect.annotateCurrentSpan({ tx_hash: record.tx_hash, nonce: record.nonce })
          return record.tx_hash as Hash
        }).pipe(Effect.withSpan("Treasury.send", { attributes: attributes(transfer) }))

      const confirm = (hash: Hash) =>
        Effect.gen(function* () {
          const [record] = yield* decoded(
            sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions WHERE tx_hash = ${hash.toLowerCase()}`
          )
          // A hash the treasury did not sign (recorded before it existed): the chain's receipt alone.
          if (record === undefined) return yield* chain.waitForReceipt(hash)
          const final = outcomeOf(record)
          if (final !== undefined) return final
          const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(confirmTimeout)
          while (true) {
            // The head before the look: a block mined during the look is then a new one to look again at.
            const seen = Option.getOrUndefined(yield* Effect.option(head))
            const resolution = yield* resolve(record)
            if (resolution.status !== "pending") return resolution
            yield* fillGapBelow(record)
            if ((yield* Clock.currentTimeMillis) >= deadline) {
              return yield* new ChainError({
                reason: "Timeout",
                message: `Treasury.confirm: ${hash} not final in ${Duration.format(confirmTimeout)}`
              })
            }
            yield* blockAfter(seen)
          }
        }).pipe(Effect.withSpan("Treasury.confirm", { attributes: { tx_hash: hash } }))

      const recorded = (transfer: OutgoingTransfer) =>
        Effect.map(liveFor(purposeOf(transfer)), (row) => row?.tx_hash as Hash | undefined)

      const recover = Effect.gen(function* () {
        const open = yield* decoded(
          sql`SELECT ${sql.literal(COLUMNS)} FROM outgoing_transactions
              WHERE status IN ('signed', 'broadcast') ORDER BY outgoing_transactions.sender, outgoing_transactions.nonce`
        )
        let left = 0
        for (const record of open) {
          const resolution = yield* resolve(record).pipe(
            Effect.catchTag("ChainError", (e) =>
              Effect.as(
                Effect.logWarning("recovery could not resolve an outgoing transaction", {
                  purpose: record.purpose,
                  tx_hash: record.tx_hash,
                  error: e.message
                }),
                { status: "pending" } as const
              )
            )
          )
          if (resolution.status === "pending") left++
        }
        yield* Effect.annotateCurrentSpan({ open: open.length, left })
        return left
      }).pipe(Effect.withSpan("Treasury.recover"))

      return Treasury.of({ send, confirm, recorded, recover })
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
