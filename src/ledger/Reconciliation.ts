import { Cause, Config, Context, Duration, Effect, Exit, Layer, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import {
  type Address,
  type Hash,
  isAddressEqual,
  parseEventLogs,
  TransactionReceiptNotFoundError
} from "viem"
import { testUsdcAbi } from "../chain/artifacts.ts"
import { Chain } from "../chain/Chain.ts"
import { fromViemError } from "../chain/ChainError.ts"
import { ROUTER_FEE_BPS } from "../domain/Billing.ts"
import {
  type Discrepancy,
  isTxHash,
  type ReconciliationResult,
  splitDiscrepancies,
  type TxTransfers
} from "./Discrepancies.ts"
import { withAdvisoryLock } from "./Epochs.ts"

export type { Discrepancy, DiscrepancyKind, ReconciliationResult } from "./Discrepancies.ts"

const MAX_RECORDED = 50
const RECONCILIATION_LOCK = 7402003

/**
 * Compares the ledger with the chain and with itself:
 * - every `landed` x402 authorization has, in its recorded transaction, a Transfer payer → treasury of
 *   exactly its value, a `settled` ledger row of that value, and capture + refund due equal to it;
 * - every `paid` refund batch has, in its transaction, a Transfer treasury (or the router signer, D16)
 *   → payer of the batch total, and `refund_paid` rows summing to it;
 * - every `paid` provider payout has, in its transaction, a Transfer treasury (or the router signer)
 *   → the provider's signer of exactly its amount, one `provider_paid` row of that amount, and the
 *   provider shares of the requests it pays summing to it;
 * - the treasury's net movement in those transactions equals settled minus refunds and payouts paid in
 *   the ledger;
 * - for every captured request, router fee + provider share = capture = the charge, fee = 7%;
 * - every closed epoch's root is the one on chain, and every receipt of a closed epoch is in it.
 * Each run is a `reconciliation_runs` row: `running`, then `ok` or `failed` with the first discrepancies.
 */
export class Reconciliation extends Context.Service<
  Reconciliation,
  { readonly runOnce: Effect.Effect<ReconciliationResult> }
>()("router/ledger/Reconciliation") {
  static readonly make = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain

    // Mined transactions and anchored roots do not change: each is read from the chain once.
    const txCache = new Map<Hash, TxTransfers>()
    const verifiedEpochs = new Set<string>()
    const remember = (hash: Hash, value: TxTransfers) => {
      if (txCache.size >= 20_000) txCache.delete(txCache.keys().next().value!)
      txCache.set(hash, value)
    }

    const transfersOf = (hash: Hash) =>
      Effect.gen(function* () {
        const cached = txCache.get(hash)
        if (cached !== undefined) return cached
        const receipt = yield* Effect.tryPromise({
          try: () =>
            chain.publicClient
              .getTransactionReceipt({ hash })
              .catch((e) => (e instanceof TransactionReceiptNotFoundError ? null : Promise.reject(e))),
          catch: fromViemError("Reconciliation.transfersOf")
        }).pipe(Effect.retry({ times: 2, schedule: Schedule.spaced("300 millis") }))
        if (receipt === null) return { status: "missing", transfers: [] } satisfies TxTransfers
        const transfers = parseEventLogs({ abi: testUsdcAbi, eventName: "Transfer", logs: receipt.logs })
          .filter((log) => isAddressEqual(log.address, chain.token))
          .map((log) => ({ from: log.args.from, to: log.args.to, value: log.args.value }))
        const result: TxTransfers = { status: receipt.status, transfers }
        remember(hash, result)
        return result
      })

    const sum = (values: ReadonlyArray<bigint>) => values.reduce((a, b) => a + b, 0n)
    const treasurySenders = [chain.treasury, chain.routerSigner]

    const checkSettlements = Effect.gen(function* () {
      const out: Array<Discrepancy> = []
      const rows = yield* sql<{
        request_id: string
        payer: Address
        value: string
        tx_hash: string | null
        settled: string
        captured: string
        refund_due: string
        session_id: string | null
        session_status: string | null
        budget: string | null
        spent: string | null
        session_captured: string
      }>`
        SELECT a.request_id, a.payer, a.value::text AS value, a.tx_hash,
          coalesce((SELECT sum(l.amount) FROM ledger_entries l
                    WHERE l.request_id = a.request_id AND l.kind = 'settled' AND l.ref = a.tx_hash), 0)::text AS settled,
          coalesce((SELECT sum(l.amount) FROM ledger_entries l
                    WHERE l.request_id = a.request_id AND l.kind IN ('capture', 'deposit_pending')), 0)::text AS captured,
          coalesce((SELECT sum(l.amount) FROM ledger_entries l
                    WHERE l.request_id = a.request_id AND l.kind = 'refund_due'), 0)::text AS refund_due,
          s.session_id, s.status AS session_status, s.budget::text AS budget, s.spent::text AS spent,
          coalesce((SELECT sum(l.amount) FROM ledger_entries l JOIN requests q ON q.request_id = l.request_id
                    WHERE s.session_id IS NOT NULL AND q.session_id = s.session_id AND l.kind = 'capture'), 0)::text
            AS session_captured
        FROM x402_authorizations a
        LEFT JOIN sessions s ON s.funding_request_id = a.request_id AND s.funding_kind = 'x402'
        WHERE a.status = 'landed' ORDER BY a.created_at, a.request_id
      `.pipe(Effect.orDie)
      let chainIn = 0n
      for (const row of rows) {
        const base = { request_id: row.request_id, tx: row.tx_hash ?? undefined }
        if (row.settled !== row.value) {
          out.push({
            ...base,
            kind: "settlement_ledger_mismatch",
            expected: row.value,
            actual: row.settled,
            detail: "the settled ledger row does not match the authorization's value"
          })
        }
        out.push(...splitDiscrepancies(row, base))
        if (!isTxHash(row.tx_hash)) {
          out.push({
            ...base,
            kind: "settlement_tx_missing",
            detail: "a landed authorization without a transaction"
          })
          continue
        }
        const tx = yield* transfersOf(row.tx_hash)
        if (tx.status !== "success") {
          out.push({
            ...base,
            kind: "settlement_tx_missing",
            detail: `the transaction is ${tx.status} on chain`
          })
          continue
        }
        const inflow = tx.transfers.filter((t) => isAddressEqual(t.to, chain.treasury))
        chainIn += sum(inflow.map((t) => t.value))
        const paid = sum(inflow.filter((t) => isAddressEqual(t.from, row.payer)).map((t) => t.value))
        if (paid.toString() !== row.value) {
          out.push({
            ...base,
            kind: "settlement_transfer_mismatch",
            expected: row.value,
            actual: paid.toString(),
            detail: "the on-chain transfer payer → treasury differs from the authorization's value"
          })
        }
      }
      return { discrepancies: out, chainIn }
    })

    const checkRefunds = Effect.gen(function* () {
      const out: Array<Discrepancy> = []
      const rows = yield* sql<{
        tx_hash: string | null
        payer: Address
        total: string
        booked: string
        request_ids: ReadonlyArray<string>
      }>`
        SELECT f.tx_hash, f.payer, sum(f.amount)::text AS total,
          array_agg(f.request_id ORDER BY f.request_id) AS request_ids,
          coalesce((SELECT sum(l.amount) FROM ledger_entries l
                    WHERE l.kind = 'refund_paid' AND l.ref = f.tx_hash), 0)::text AS booked
        FROM refunds f WHERE f.status = 'paid' GROUP BY f.tx_hash, f.payer ORDER BY min(f.settled_at)
      `.pipe(Effect.orDie)
      let chainOut = 0n
      for (const row of rows) {
        const base = { request_ids: row.request_ids, tx: row.tx_hash ?? undefined }
        if (row.booked !== row.total) {
          out.push({
            ...base,
            kind: "refund_ledger_mismatch",
            expected: row.total,
            actual: row.booked,
            detail: "refund_paid ledger rows do not add up to the refunds paid in this transaction"
          })
        }
        if (!isTxHash(row.tx_hash)) {
          out.push({ ...base, kind: "refund_tx_missing", detail: "a paid refund without a transaction" })
          continue
        }
        const tx = yield* transfersOf(row.tx_hash)
        if (tx.status !== "success") {
          out.push({ ...base, kind: "refund_tx_missing", detail: `the transaction is ${tx.status} on chain` })
          continue
        }
        const outflow = tx.transfers.filter((t) => treasurySenders.some((s) => isAddressEqual(t.from, s)))
        chainOut += sum(outflow.map((t) => t.value))
        const sent = sum(outflow.filter((t) => isAddressEqual(t.to, row.payer)).map((t) => t.value))
        if (sent.toString() !== row.total) {
          out.push({
            ...base,
            kind: "refund_transfer_mismatch",
            expected: row.total,
            actual: sent.toString(),
            detail: "the on-chain refund transfer differs from the refunds recorded as paid"
          })
        }
      }
      return { discrepancies: out, chainOut }
    })

    const checkPayouts = Effect.gen(function* () {
      const out: Array<Discrepancy> = []
      const rows = yield* sql<{
        payout_id: string
        provider_id: string
        to_address: Address
        amount: string
        tx_hash: string | null
        booked: string
        shares: string
      }>`
        SELECT p.payout_id, p.provider_id, p.to_address, p.amount::text AS amount, p.tx_hash,
          coalesce((SELECT sum(l.amount) FROM ledger_entries l
                    WHERE l.kind = 'provider_paid' AND l.ref = p.tx_hash
                      AND l.account = 'provider:' || p.provider_id), 0)::text AS booked,
          coalesce((SELECT sum(l.amount) FROM requests q
                    JOIN ledger_entries l ON l.request_id = q.request_id AND l.kind = 'provider_share'
                    WHERE q.payout_id = p.payout_id), 0)::text AS shares
        FROM provider_payouts p WHERE p.status = 'paid' ORDER BY p.paid_at, p.payout_id
      `.pipe(Effect.orDie)
      let chainOut = 0n
      for (const row of rows) {
        const base = { payout_id: row.payout_id, tx: row.tx_hash ?? undefined }
        const provider = `provider ${row.provider_id}`
        if (row.booked !== row.amount) {
          out.push({
            ...base,
            kind: "payout_ledger_mismatch",
            expected: row.amount,
            actual: row.booked,
            detail: `${provider}: the provider_paid ledger row does not match the payout`
          })
        }
        if (row.shares !== row.amount) {
          out.push({
            ...base,
            kind: "payout_ledger_mismatch",
            expected: row.amount,
            actual: row.shares,
            detail: `${provider}: the shares of the requests the payout pays do not add up to it`
          })
        }
        if (!isTxHash(row.tx_hash)) {
          out.push({
            ...base,
            kind: "payout_tx_missing",
            detail: `${provider}: a paid payout without a transaction`
          })
          continue
        }
        const tx = yield* transfersOf(row.tx_hash)
        if (tx.status !== "success") {
          out.push({
            ...base,
            kind: "payout_tx_missing",
            detail: `${provider}: the transaction is ${tx.status} on chain`
          })
          continue
        }
        const outflow = tx.transfers.filter((t) => treasurySenders.some((s) => isAddressEqual(t.from, s)))
        chainOut += sum(outflow.map((t) => t.value))
        const sent = sum(outflow.filter((t) => isAddressEqual(t.to, row.to_address)).map((t) => t.value))
        if (sent.toString() !== row.amount) {
          out.push({
            ...base,
            kind: "payout_transfer_mismatch",
            expected: row.amount,
            actual: sent.toString(),
            detail: `${provider}: the on-chain transfer to its signer differs from the payout`
          })
        }
      }
      return { discrepancies: out, chainOut }
    })

    const checkTreasury = (chainIn: bigint, chainOut: bigint) =>
      Effect.gen(function* () {
        const rows = yield* sql<{ settled: string; paid_out: string }>`
          SELECT coalesce(sum(amount) FILTER (WHERE kind = 'settled'), 0)::text AS settled,
                 coalesce(sum(amount) FILTER (WHERE kind IN ('refund_paid', 'provider_paid')), 0)::text AS paid_out
          FROM ledger_entries WHERE kind IN ('settled', 'refund_paid', 'provider_paid')
        `.pipe(Effect.orDie)
        const ledgerNet = BigInt(rows[0]!.settled) - BigInt(rows[0]!.paid_out)
        const chainNet = chainIn - chainOut
        return ledgerNet === chainNet
          ? []
          : [
              {
                kind: "treasury_mismatch",
                expected: ledgerNet.toString(),
                actual: chainNet.toString(),
                detail:
                  "settled minus refunds and payouts paid in the ledger differs from the treasury's net movement on chain"
              } satisfies Discrepancy
            ]
      })

    // Only the rows that break an identity come back; the fee rule mirrors Billing.feeSplit (half up).
    const checkFees = sql<{
      request_id: string
      charged: string
      capture: string
      fee: string
      share: string
    }>`
      SELECT q.request_id, q.charged::text AS charged,
        coalesce(sum(l.amount) FILTER (WHERE l.kind = 'capture'), 0)::text AS capture,
        coalesce(sum(l.amount) FILTER (WHERE l.kind = 'router_fee'), 0)::text AS fee,
        coalesce(sum(l.amount) FILTER (WHERE l.kind = 'provider_share'), 0)::text AS share
      FROM requests q JOIN ledger_entries l ON l.request_id = q.request_id
      WHERE q.status = 'captured' AND q.dialect <> 'deposit'
      GROUP BY q.request_id, q.charged
      HAVING coalesce(sum(l.amount) FILTER (WHERE l.kind = 'capture'), 0) <> q.charged
        OR coalesce(sum(l.amount) FILTER (WHERE l.kind IN ('router_fee', 'provider_share')), 0) <> q.charged
        OR coalesce(sum(l.amount) FILTER (WHERE l.kind = 'router_fee'), 0)
           <> (q.charged * ${ROUTER_FEE_BPS} + 5000) / 10000
      ORDER BY q.request_id
      LIMIT ${MAX_RECORDED}
    `.pipe(
      Effect.map((rows) =>
        rows.map(
          (row): Discrepancy => ({
            kind: "fee_split_mismatch",
            request_id: row.request_id,
            expected: row.charged,
            actual: `capture ${row.capture}, router_fee ${row.fee}, provider_share ${row.share}`,
            detail: "router fee (7%) + provider share must equal the capture and the charge"
          })
        )
      ),
      Effect.orDie
    )

    const checkEpochs = Effect.gen(function* () {
      const out: Array<Discrepancy> = []
      const closed = yield* sql<{ epoch_id: string; root: string }>`
        SELECT epoch_id::text AS epoch_id, root FROM epochs WHERE status = 'closed' ORDER BY epoch_id
      `.pipe(Effect.orDie)
      for (const epoch of closed) {
        if (verifiedEpochs.has(`${epoch.epoch_id}:${epoch.root}`)) continue
        const onChain = yield* chain
          .anchoredRoot(BigInt(epoch.epoch_id))
          .pipe(Effect.retry({ times: 2, schedule: Schedule.spaced("300 millis") }))
        if (onChain.toLowerCase() === epoch.root.toLowerCase())
          verifiedEpochs.add(`${epoch.epoch_id}:${epoch.root}`)
        else
          out.push({
            kind: "epoch_root_mismatch",
            epoch_id: Number(epoch.epoch_id),
            expected: epoch.root,
            actual: onChain,
            detail: "the recorded epoch root is not the one anchored on chain"
          })
      }
      const late = yield* sql<{ request_id: string; epoch_id: string }>`
        SELECT r.request_id, r.epoch_id::text AS epoch_id FROM receipts r
        JOIN epochs e ON e.epoch_id = r.epoch_id
        WHERE r.leaf IS NULL AND e.status = 'closed' ORDER BY r.request_id LIMIT ${MAX_RECORDED}
      `.pipe(Effect.orDie)
      for (const row of late) {
        out.push({
          kind: "receipt_not_anchored",
          request_id: row.request_id,
          epoch_id: Number(row.epoch_id),
          detail: "a receipt of a closed epoch is not in its anchored root"
        })
      }
      return out
    })

    // One snapshot for every read of a run: a settlement landing mid-run must not look like a mismatch.
    const checks = Effect.gen(function* () {
      yield* sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`
      const settlements = yield* checkSettlements
      const refunds = yield* checkRefunds
      const payouts = yield* checkPayouts
      const treasury = yield* checkTreasury(settlements.chainIn, refunds.chainOut + payouts.chainOut)
      const fees = yield* checkFees
      const epochs = yield* checkEpochs
      return [
        ...settlements.discrepancies,
        ...refunds.discrepancies,
        ...payouts.discrepancies,
        ...treasury,
        ...fees,
        ...epochs
      ]
    }).pipe(
      Effect.catchTag("ChainError", (e) =>
        Effect.succeed<Array<Discrepancy>>([
          { kind: "chain_unreachable", detail: `the chain could not be read: ${e.message}` }
        ])
      ),
      (self) => sql.withTransaction(self),
      Effect.orDie
    )

    const finish = (id: string, discrepancies: ReadonlyArray<Discrepancy>) => {
      const status = discrepancies.length === 0 ? ("ok" as const) : ("failed" as const)
      const recorded = discrepancies.slice(0, MAX_RECORDED)
      return Effect.as(
        sql`UPDATE reconciliation_runs SET status = ${status}, finished_at = now(),
              discrepancies = ${JSON.stringify(recorded)}::jsonb WHERE id = ${id}`.pipe(Effect.orDie),
        { id: Number(id), status, discrepancies: recorded } satisfies ReconciliationResult
      )
    }

    const runOnce = Effect.gen(function* () {
      const [run] = yield* sql<{ id: string }>`
        INSERT INTO reconciliation_runs (status) VALUES ('running') RETURNING id::text AS id
      `.pipe(Effect.orDie)
      const id = run!.id
      const discrepancies = yield* checks.pipe(
        Effect.onExit((exit) =>
          Exit.isSuccess(exit)
            ? Effect.void
            : Cause.hasInterruptsOnly(exit.cause)
              ? // A run that never finished says nothing: the previous result stands.
                Effect.ignore(sql`DELETE FROM reconciliation_runs WHERE id = ${id}`)
              : Effect.ignore(
                  finish(id, [
                    { kind: "reconciliation_error", detail: Cause.pretty(exit.cause).slice(0, 300) }
                  ])
                )
        )
      )
      const result = yield* finish(id, discrepancies)
      if (result.status === "failed") {
        yield* Effect.logError("reconciliation failed", {
          run: result.id,
          discrepancies: discrepancies.length,
          first: discrepancies[0]
        })
      }
      return result
    }).pipe(Effect.withSpan("Reconciliation.runOnce"))

    return Reconciliation.of({ runOnce })
  })

  /** The service plus a run every `RECONCILIATION_INTERVAL_SECONDS` (default 300; 0: no schedule). */
  static readonly layer = Layer.effect(
    Reconciliation,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const service = yield* Reconciliation.make
      const every = yield* Config.Int("RECONCILIATION_INTERVAL_SECONDS").pipe(Config.withDefault(300))
      if (every > 0) {
        yield* Effect.sleep(Duration.seconds(every)).pipe(
          Effect.andThen(withAdvisoryLock(RECONCILIATION_LOCK)(service.runOnce)),
          Effect.provideService(SqlClient.SqlClient, sql),
          Effect.catchCause((cause) => Effect.logError("reconciliation run failed", cause)),
          Effect.forever,
          Effect.forkScoped
        )
      }
      return service
    })
  )
}
