import { Clock, Config, Context, Effect, Layer, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { type Address, getAddress, type Hash, type Hex, zeroHash } from "viem"
import { repeatInBackground } from "../Background.ts"
import { epochAnchorAbi } from "../chain/artifacts.ts"
import { Chain, type ChainError } from "../chain/Chain.ts"
import { fromViemError } from "../chain/ChainError.ts"
import { ReceiptBody } from "../domain/Receipt.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { Ledger } from "./Ledger.ts"
import { buildTree, compareRequestIds, type MerkleTree, proofOf, receiptLeaf } from "./Merkle.ts"
import { makeProviderPayouts } from "./Payouts.ts"
import { Treasury } from "./Treasury.ts"

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
/** Receipts of epochs older than this are never looked at again (`exact` authorizations live ≤ 7 days). */
const LOOKBACK_MS = 8 * 24 * 3600 * 1000
const LOG_PAGE = 10_000n

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
const decodeReceipt = Schema.decodeUnknownEffect(ReceiptBody)

interface Closing {
  readonly epoch_id: string
  readonly root: string
  readonly anchor_tx: string | null
  readonly from_block: string | null
}

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
 * 1. refunds: the overage of every captured request whose payment landed is refunded once its epoch
 *    has ended, batched per payer in one transfer from the treasury, or credited to the payer's balance
 *    below the payout floor; a broadcast recorded before a crash is confirmed, never re-sent;
 * 2. provider payouts: each provider's final, unpaid shares of ended epochs in one transfer from the
 *    treasury to its registered signer once they reach the payout floor (src/ledger/Payouts.ts);
 * 3. receipts left behind by a crash between a settlement and its receipt update are re-finalized;
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
    const ledger = yield* Ledger
    const treasury = yield* Treasury
    const { epochSeconds } = yield* RouterConfig
    const { payoutFloor } = yield* PayoutConfig
    const payouts = yield* makeProviderPayouts({ payoutFloor })
    const epochMs = epochSeconds * 1000
    // Room for a request whose clock was read just before the boundary to insert its reservation.
    const graceMs = Math.min(30_000, epochMs / 2)

    const currentEpoch = Effect.map(Clock.currentTimeMillis, (now) => epochOf(now, epochSeconds))

    // ---- 1. refunds ----

    /**
     * Writes the refund into the receipts it belongs to. A receipt already in an anchored (or closing)
     * epoch is never re-signed: a refund settled after that (a session's close-out) stays in the ledger.
     */
    const stampRefund = (requestIds: ReadonlyArray<string>, refundRef: string) =>
      Effect.gen(function* () {
        const open = yield* sql<{ request_id: string }>`
          SELECT request_id FROM receipts WHERE request_id IN ${sql.in(requestIds)} AND leaf IS NULL
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
                WHERE request_id IN ${sql.in(requestIds)} AND status = 'paying' RETURNING request_id`
              if (paid.length === 0) return
              yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                         SELECT request_id, payer, 'refund_paid', amount, ${hash} FROM refunds
                         WHERE request_id IN ${sql.in(paid.map((p) => p.request_id))}`
            })
          )
          .pipe(Effect.orDie)
        yield* stampRefund(requestIds, hash)
        yield* Effect.annotateCurrentSpan({ payer, refunds: requestIds.length })
      })

    const backToDue = (requestIds: ReadonlyArray<string>) =>
      sql`UPDATE refunds SET status = 'due', tx_hash = NULL WHERE request_id IN ${sql.in(requestIds)}`.pipe(
        Effect.orDie
      )

    /** Broadcasts recorded before a crash are confirmed, not re-sent. */
    const resumePaying = Effect.gen(function* () {
      const rows = yield* sql`
        SELECT payer, tx_hash, array_agg(request_id) AS request_ids FROM refunds
        WHERE status = 'paying' AND tx_hash IS NOT NULL GROUP BY payer, tx_hash
      `.pipe(Effect.flatMap(decodePaying), Effect.orDie)
      for (const row of rows) {
        const outcome = yield* treasury.confirm(row.tx_hash as Hex)
        if (outcome.status === "success") yield* markPaid(row.payer, row.tx_hash as Hex, row.request_ids)
        else yield* backToDue(row.request_ids)
      }
    })

    const settleRefunds = Effect.gen(function* () {
      const epoch = yield* currentEpoch
      yield* resumePaying
      // Claimed by a pass that died before its send was recorded: back to due (docs/decisions.md D21).
      yield* sql`UPDATE refunds SET status = 'due' WHERE status = 'paying' AND tx_hash IS NULL`.pipe(
        Effect.orDie
      )
      // Claim due refunds of ended epochs whose payment landed; credit small ones in the same step.
      const groups = yield* sql
        .withTransaction(
          Effect.gen(function* () {
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
          yield* stampRefund(group.request_ids, `balance:${group.payer}`)
          continue
        }
        // Each batch stands alone: a send that fails puts only its own refunds back to `due`
        // (the next pass retries them) and the other payers' batches still go out.
        const sent = yield* treasury
          .send({
            _tag: "RefundBatch",
            to: getAddress(group.payer),
            amount: BigInt(group.total),
            requestIds: group.request_ids
          })
          .pipe(
            Effect.tapError((e) => Effect.logWarning("refund batch not sent; back to due", e.message)),
            Effect.option
          )
        if (Option.isNone(sent)) {
          yield* backToDue(group.request_ids)
          continue
        }
        const hash = sent.value
        yield* sql`UPDATE refunds SET tx_hash = ${hash} WHERE request_id IN ${sql.in(group.request_ids)}`.pipe(
          Effect.orDie
        )
        // A failed wait leaves the batch `paying` with its hash: the next pass confirms it.
        const outcome = yield* treasury.confirm(hash).pipe(Effect.option)
        if (Option.isNone(outcome)) continue
        if (outcome.value.status === "success") yield* markPaid(group.payer, hash, group.request_ids)
        else yield* backToDue(group.request_ids)
      }
      return settled
    }).pipe(
      Effect.catchTag("ChainError", (e) =>
        Effect.as(Effect.logWarning("refund batch failed; will retry", e.message), 0)
      ),
      Effect.withSpan("Epochs.settleRefunds")
    )

    // ---- 3. receipts a crash left behind (2. provider payouts: Payouts.ts) ----

    const repairReceipts = (epoch: string) =>
      Effect.gen(function* () {
        const settled = yield* sql<{ request_id: string; status: string; tx_hash: string | null }>`
          SELECT r.request_id, a.status, a.tx_hash FROM receipts r
          JOIN x402_authorizations a ON a.request_id = r.request_id
          WHERE r.epoch_id = ${epoch} AND r.body->>'settlement' = 'pending'
            AND a.status IN ('landed', 'failed') AND a.updated_at < now() - interval '5 seconds'
        `.pipe(Effect.orDie)
        for (const row of settled) {
          yield* ledger.finalizeReceipt(
            row.request_id,
            row.status === "landed" && row.tx_hash !== null
              ? { payment_ref: row.tx_hash, settlement: "landed" }
              : { settlement: "failed" }
          )
        }
        const refunded = yield* sql<{
          request_id: string
          status: string
          tx_hash: string | null
          payer: string
        }>`
          SELECT r.request_id, f.status, f.tx_hash, f.payer FROM receipts r
          JOIN refunds f ON f.request_id = r.request_id
          WHERE r.epoch_id = ${epoch} AND f.status IN ('paid', 'credited') AND r.body->>'refund_ref' IS NULL
            AND f.settled_at < now() - interval '5 seconds'
        `.pipe(Effect.orDie)
        for (const row of refunded) {
          yield* ledger.finalizeReceipt(row.request_id, {
            refund_ref: row.status === "paid" && row.tx_hash !== null ? row.tx_hash : `balance:${row.payer}`
          })
        }
      })

    // ---- 4. roots and anchors ----

    const isReady = (epoch: string, boundarySeconds: number) =>
      sql<{ open: number }>`
        SELECT
          (SELECT count(*)::int FROM receipts WHERE epoch_id = ${epoch}
             AND (NOT final OR signature IS NULL OR body->>'settlement' = 'pending'))
          + (SELECT count(*)::int FROM refunds f WHERE f.epoch_id = ${epoch} AND f.status IN ('due', 'paying')
             AND NOT EXISTS (SELECT 1 FROM x402_authorizations a
                             WHERE a.request_id = f.request_id AND a.status IN ('failed', 'released')))
          + (SELECT count(*)::int FROM receipts r JOIN refunds f ON f.request_id = r.request_id
             WHERE r.epoch_id = ${epoch} AND f.status IN ('paid', 'credited') AND r.body->>'refund_ref' IS NULL)
          -- a reservation older than 30 minutes belongs to a dead instance and holds nothing open
          + (SELECT count(*)::int FROM requests WHERE status = 'reserved'
             AND created_at < to_timestamp(${boundarySeconds})
             AND created_at > now() - interval '30 minutes')
          AS open
      `.pipe(
        Effect.map((rows) => rows[0]?.open === 0),
        Effect.orDie
      )

    /** Computes the root over the epoch's final receipts and records it (`closing`) in one transaction. */
    const recordClosing = (epoch: string) =>
      Effect.gen(function* () {
        const fromBlock = yield* chain.blockNumber()
        return yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const rows = yield* sql<{
                request_id: string
                body: unknown
                final: boolean
                signature: unknown
              }>`
                SELECT request_id, body, final, signature FROM receipts WHERE epoch_id = ${epoch} FOR UPDATE
              `
              const receipts = yield* Effect.forEach(rows, (row) => decodeReceipt(row.body))
              const unsettled = rows.some(
                (row, i) => !row.final || row.signature === null || receipts[i]!.settlement === "pending"
              )
              if (unsettled || receipts.length === 0) return undefined
              const ordered = receipts
                .map((receipt) => ({
                  request_id: receipt.request_id,
                  leaf: receiptLeaf(receipt, chain.chainId)
                }))
                .sort((a, b) => compareRequestIds(a.request_id, b.request_id))
              const tree = buildTree(ordered.map((o) => o.leaf))!
              const positions = ordered.map((o, idx) => ({ ...o, idx }))
              yield* sql`
                UPDATE receipts r SET leaf = v.leaf, leaf_index = v.idx
                FROM jsonb_to_recordset(${JSON.stringify(positions)}::jsonb) AS v(request_id text, leaf text, idx int)
                WHERE r.request_id = v.request_id
              `
              yield* sql`
                INSERT INTO epochs (epoch_id, status, root, receipts, from_block)
                VALUES (${epoch}, 'closing', ${tree.root}, ${ordered.length}, ${fromBlock.toString()})
              `
              return {
                epoch_id: epoch,
                root: tree.root,
                anchor_tx: null,
                from_block: fromBlock.toString()
              } satisfies Closing
            })
          )
          .pipe(Effect.orDie)
      })

    const findAnchorTx = (epochId: bigint, root: string, fromBlock: bigint) =>
      Effect.gen(function* () {
        const latest = yield* chain.blockNumber()
        for (let start = fromBlock; start <= latest; start += LOG_PAGE) {
          const end = start + LOG_PAGE - 1n < latest ? start + LOG_PAGE - 1n : latest
          const logs = yield* Effect.tryPromise({
            try: () =>
              chain.publicClient.getContractEvents({
                address: chain.anchor,
                abi: epochAnchorAbi,
                eventName: "EpochAnchored",
                args: { epochId },
                fromBlock: start,
                toBlock: end,
                strict: true
              }),
            catch: fromViemError("Epochs.findAnchorTx")
          })
          const hit = logs.find((log) => log.args.root.toLowerCase() === root)
          if (hit?.transactionHash) return hit.transactionHash
        }
        return undefined
      })

    const markClosed = (epoch: string, anchorTx: string) =>
      Effect.as(
        sql`UPDATE epochs SET status = 'closed', anchor_tx = ${anchorTx}, closed_at = now()
            WHERE epoch_id = ${epoch} AND status = 'closing'`.pipe(Effect.orDie),
        true
      )

    const clearAnchorTx = (epoch: string) =>
      sql`UPDATE epochs SET anchor_tx = NULL WHERE epoch_id = ${epoch} AND status = 'closing'`.pipe(
        Effect.orDie
      )

    /** Takes a `closing` epoch to `closed`; false when it must be retried on a later pass. */
    const anchor = (row: Closing): Effect.Effect<boolean, ChainError> =>
      Effect.gen(function* () {
        const epochId = BigInt(row.epoch_id)
        if (row.anchor_tx !== null) {
          const outcome = yield* treasury
            .confirm(row.anchor_tx as Hash)
            .pipe(
              Effect.catchTag("ChainError", (e) =>
                e.reason === "Timeout" ? Effect.succeed(undefined) : Effect.fail(e)
              )
            )
          if (outcome?.status === "success") return yield* markClosed(row.epoch_id, row.anchor_tx)
          // Reverted or dropped: what the chain holds decides below.
          yield* clearAnchorTx(row.epoch_id)
        }
        const onChain = (yield* chain.anchoredRoot(epochId)).toLowerCase()
        if (onChain === row.root) {
          const tx = yield* findAnchorTx(epochId, row.root, BigInt(row.from_block ?? "0"))
          if (tx !== undefined) return yield* markClosed(row.epoch_id, tx)
          yield* Effect.logWarning("epoch root is on chain but its transaction was not found yet", {
            epoch: row.epoch_id
          })
          return false
        }
        if (onChain !== zeroHash) {
          yield* Effect.logError("epoch anchored on chain with another root; leaving it closing", {
            epoch: row.epoch_id,
            recorded: row.root,
            on_chain: onChain
          })
          return false
        }
        const hash = yield* treasury.send({ _tag: "EpochAnchor", epochId, root: row.root as Hex })
        yield* sql`UPDATE epochs SET anchor_tx = ${hash} WHERE epoch_id = ${row.epoch_id}`.pipe(Effect.orDie)
        const outcome = yield* treasury.confirm(hash)
        if (outcome.status === "success") return yield* markClosed(row.epoch_id, hash)
        yield* clearAnchorTx(row.epoch_id)
        return false
      }).pipe(Effect.withSpan("Epochs.anchor", { attributes: { epoch: row.epoch_id } }))

    const closeEpochs = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const closable = epochOf(now - graceMs, epochSeconds)
      const oldest = epochOf(now - LOOKBACK_MS, epochSeconds)
      const closed: Array<number> = []
      const attempt = (work: Effect.Effect<boolean, ChainError>, epoch: string) =>
        work.pipe(
          Effect.catchTag("ChainError", (e) =>
            Effect.as(
              Effect.logWarning("epoch anchor failed; will resume", { epoch, error: e.message }),
              false
            )
          ),
          Effect.tap((done) => (done ? Effect.sync(() => closed.push(Number(epoch))) : Effect.void))
        )
      const resumable = yield* sql<Closing>`
        SELECT epoch_id::text AS epoch_id, root, anchor_tx, from_block::text AS from_block
        FROM epochs WHERE status = 'closing' ORDER BY epoch_id
      `.pipe(Effect.orDie)
      for (const row of resumable) yield* attempt(anchor(row), row.epoch_id)
      // Distinct epochs with receipts and no close yet, one index probe each.
      const candidates = yield* sql<{ epoch_id: string }>`
        WITH RECURSIVE e AS (
          (SELECT epoch_id FROM receipts WHERE epoch_id >= ${oldest} AND epoch_id < ${closable}
           ORDER BY epoch_id LIMIT 1)
          UNION ALL
          SELECT (SELECT r.epoch_id FROM receipts r WHERE r.epoch_id > e.epoch_id AND r.epoch_id < ${closable}
                  ORDER BY r.epoch_id LIMIT 1)
          FROM e WHERE e.epoch_id IS NOT NULL
        )
        SELECT e.epoch_id::text AS epoch_id FROM e
        WHERE e.epoch_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM epochs x WHERE x.epoch_id = e.epoch_id)
      `.pipe(Effect.orDie)
      for (const { epoch_id } of candidates) {
        yield* repairReceipts(epoch_id)
        const boundarySeconds = ((Number(epoch_id) + 1) * epochMs + graceMs) / 1000
        if (!(yield* isReady(epoch_id, boundarySeconds))) continue
        yield* attempt(
          Effect.flatMap(recordClosing(epoch_id), (row) =>
            row === undefined ? Effect.succeed(false) : anchor(row)
          ),
          epoch_id
        )
      }
      return closed
    }).pipe(Effect.withSpan("Epochs.closeEpochs"))

    const closeEnded = Effect.gen(function* () {
      const refunds = yield* settleRefunds
      const paid = yield* payouts.settle
      const closed = yield* closeEpochs
      return { refunds, payouts: paid, closed } satisfies CloseReport
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
