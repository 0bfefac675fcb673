import { Clock, Config, Context, Effect, Layer, Option } from "effect"
import { SqlClient } from "effect/sql"
import type { Address, Hash, Hex } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Chain } from "../chain/Chain.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { makeAnchors } from "./Anchors.ts"
import { buildTree, type MerkleTree, proofOf } from "./Merkle.ts"
import { makeProviderPayouts } from "./Payouts.ts"
import { makeRefunds } from "./Refunds.ts"

/**
 * Refunds below this (base units) are credited to the payer's balance instead of broadcast; provider
 * shares below it accrue to a later close.
 */
export class PayoutConfig extends Context.Service<PayoutConfig, { readonly payoutFloor: number }>()(
  "router/ledger/PayoutConfig"
) {
  static readonly layer = Layer.effect(
    PayoutConfig,
    Effect.map(Config.Int("PAYOUT_FLOOR").pipe(Config.withDefault(5_000)), (payoutFloor) =>
      PayoutConfig.of({ payoutFloor })
    )
  )
  static readonly layerTest = (payoutFloor: number) =>
    Layer.succeed(PayoutConfig, PayoutConfig.of({ payoutFloor }))
}

export const epochOf = (createdAtMs: number, epochSeconds: number) =>
  Math.floor(createdAtMs / (epochSeconds * 1000))

/**
 * Runs `self` only while this process holds the session-level advisory lock `key`, on a connection
 * reserved for the duration (so the lock spans chain calls and several transactions); `None` when
 * another instance holds it. A crashed process drops its connection and with it the lock.
 */
export const withAdvisoryLock =
  (key: number) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<Option.Option<A>, E, R | SqlClient.SqlClient> =>
    Effect.scoped(
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const connection = yield* Effect.orDie(sql.reserve)
        const locked = yield* Effect.acquireRelease(
          Effect.map(
            Effect.orDie(connection.execute("SELECT pg_try_advisory_lock($1) AS ok", [key], undefined)),
            (rows) => rows[0]?.ok === true
          ),
          (ok) =>
            ok
              ? Effect.ignore(connection.execute("SELECT pg_advisory_unlock($1)", [key], undefined))
              : Effect.void
        )
        return locked ? Option.some(yield* self) : Option.none()
      })
    )

const EPOCH_CLOSE_LOCK = 7402002

/** What a client needs to check a receipt against the root anchored on chain (docs/protocol.md 3). */
export interface Inclusion {
  readonly epoch_id: number
  readonly leaf: Hex
  readonly proof: ReadonlyArray<Hex>
  readonly root: Hex
  readonly anchor_tx: Hash
  readonly anchor_contract: Address
  readonly chain_id: number
}

export interface CloseReport {
  /** Refund rows settled (paid or credited) in this pass. */
  readonly refunds: number
  /** Provider payouts that became `paid` in this pass. */
  readonly payouts: number
  /** Epochs whose root was anchored and recorded in this pass. */
  readonly closed: ReadonlyArray<number>
}

/**
 * Epoch close, run by one instance at a time (a session advisory lock):
 * 1. refunds (src/ledger/Refunds.ts): the overage of every captured request whose payment landed is
 *    refunded once its epoch has ended, batched per payer in one transfer from the treasury, or credited
 *    to the payer's balance below the payout floor; a broadcast recorded before a crash is confirmed;
 * 2. provider payouts: each provider's final, unpaid shares of ended epochs in one transfer from the
 *    treasury to its registered signer once they reach the payout floor (src/ledger/Payouts.ts);
 * 3. (src/ledger/Anchors.ts) receipts left behind by a crash between a settlement and its receipt update are re-finalized;
 * 4. an epoch that has ended, has no request still in flight and whose receipts are all final (payment
 *    landed, none or failed; refunds settled) gets its Merkle root recorded (`closing`), then anchored
 *    on chain and recorded `closed` with the anchor transaction. A `closing` epoch is resumed: an anchor
 *    already on chain is adopted (never sent twice), a recorded transaction is awaited.
 * Epochs without receipts are never anchored (docs/decisions.md).
 */
export class Epochs extends Context.Service<
  Epochs,
  {
    readonly currentEpoch: Effect.Effect<number>
    /** One pass: refunds, payouts, then the close of every ready epoch. Empty when another instance holds the lock. */
    readonly closeEnded: Effect.Effect<CloseReport>
    /** The inclusion proof of a receipt once its epoch is anchored. */
    readonly inclusion: (requestId: string) => Effect.Effect<Inclusion | undefined>
  }
>()("router/ledger/Epochs") {
  static readonly make = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const { epochSeconds } = yield* RouterConfig
    const { payoutFloor } = yield* PayoutConfig

    const currentEpoch = Effect.map(Clock.currentTimeMillis, (now) => epochOf(now, epochSeconds))

    const refunds = yield* makeRefunds({ payoutFloor, currentEpoch })
    const payouts = yield* makeProviderPayouts({ payoutFloor })
    const anchors = yield* makeAnchors({ epochSeconds, epochOf: (ms) => epochOf(ms, epochSeconds) })

    const closeEnded = Effect.gen(function* () {
      const refunded = yield* refunds.settle
      const paid = yield* payouts.settle
      const closed = yield* anchors.closeEpochs
      return { refunds: refunded, payouts: paid, closed } satisfies CloseReport
    }).pipe(
      withAdvisoryLock(EPOCH_CLOSE_LOCK),
      Effect.map(Option.getOrElse((): CloseReport => ({ refunds: 0, payouts: 0, closed: [] }))),
      Effect.provideService(SqlClient.SqlClient, sql),
      Effect.withSpan("Epochs.closeEnded")
    )

    // ---- inclusion proofs ----

    // Built trees of recently asked epochs; an epoch's leaves never change once it is closed.
    const trees = new Map<string, MerkleTree>()
    const treeOf = (epoch: string, root: string) =>
      Effect.gen(function* () {
        const cached = trees.get(epoch)
        if (cached !== undefined) return cached
        const leaves = yield* sql<{ leaf: Hex }>`
          SELECT leaf FROM receipts WHERE epoch_id = ${epoch} AND leaf_index IS NOT NULL ORDER BY leaf_index
        `.pipe(Effect.orDie)
        const tree = buildTree(leaves.map((l) => l.leaf))
        if (tree === undefined || tree.root !== root) {
          yield* Effect.logError("stored leaves do not rebuild the recorded root", { epoch })
          return undefined
        }
        if (trees.size >= 16) trees.delete(trees.keys().next().value!)
        trees.set(epoch, tree)
        return tree
      })

    const inclusion = Effect.fn("Epochs.inclusion")(function* (requestId: string) {
      const rows = yield* sql<{
        epoch_id: string
        leaf: Hex | null
        leaf_index: number | null
        root: Hex
        anchor_tx: Hash | null
      }>`
        SELECT r.epoch_id::text AS epoch_id, r.leaf, r.leaf_index, e.root, e.anchor_tx
        FROM receipts r JOIN epochs e ON e.epoch_id = r.epoch_id
        WHERE r.request_id = ${requestId} AND e.status = 'closed'
      `.pipe(Effect.orDie)
      const row = rows[0]
      if (row === undefined || row.leaf === null || row.leaf_index === null || row.anchor_tx === null) {
        return undefined
      }
      const tree = yield* treeOf(row.epoch_id, row.root)
      if (tree === undefined) return undefined
      return {
        epoch_id: Number(row.epoch_id),
        leaf: row.leaf,
        proof: proofOf(tree, row.leaf_index),
        root: row.root,
        anchor_tx: row.anchor_tx,
        anchor_contract: chain.anchor,
        chain_id: chain.chainId
      } satisfies Inclusion
    })

    return Epochs.of({ currentEpoch, closeEnded, inclusion })
  })

  static readonly layer = Layer.effect(
    Epochs,
    Effect.gen(function* () {
      const epochs = yield* Epochs.make
      yield* repeatInBackground(epochs.closeEnded, { every: "1 second", failure: "epoch close failed" })
      return epochs
    })
  )
}
