import { Clock, Effect, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { type Hash, type Hex, zeroHash } from "viem"
import { epochAnchorAbi } from "../chain/artifacts.ts"
import { Chain, type ChainError } from "../chain/Chain.ts"
import { fromViemError } from "../chain/ChainError.ts"
import { ReceiptBody } from "../domain/Receipt.ts"
import { Ledger } from "./Ledger.ts"
import { buildTree, compareRequestIds, receiptLeaf } from "./Merkle.ts"
import { Treasury } from "./Treasury.ts"

/** Receipts of epochs older than this are never looked at again (`exact` authorizations live ≤ 7 days). */
const LOOKBACK_MS = 8 * 24 * 3600 * 1000
const LOG_PAGE = 10_000n

const decodeReceipt = Schema.decodeUnknownEffect(ReceiptBody)

interface Closing {
  readonly epoch_id: string
  readonly root: string
  readonly anchor_tx: string | null
  readonly from_block: string | null
}

/**
 * Steps 3 and 4 of the epoch close: receipts a crash left behind are re-finalized, then every ended
 * epoch with nothing in flight and only final receipts gets its Merkle root recorded (`closing`) and
 * anchored on chain (`closed`). A `closing` epoch is resumed: an anchor already on chain is adopted,
 * a recorded transaction awaited, never sent twice. Run under the epoch-close lock.
 */
export const makeAnchors = (options: {
  readonly epochSeconds: number
  readonly epochOf: (ms: number) => number
}) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const ledger = yield* Ledger
    const treasury = yield* Treasury
    const { epochSeconds } = options
    const epochMs = epochSeconds * 1000
    // Room for a request whose clock was read just before the boundary to insert its reservation.
    const graceMs = Math.min(30_000, epochMs / 2)
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
              SELECT request_id, body, final, signature FROM receipts WHERE epoch_id = ${epoch}
              ORDER BY request_id FOR UPDATE
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
      const closable = options.epochOf(now - graceMs)
      const oldest = options.epochOf(now - LOOKBACK_MS)
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

    return { closeEpochs }
  })
