import { Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { type Address, isAddressEqual } from "viem"
import type { ChainShape } from "../chain/Chain.ts"
import { ROUTER_FEE_BPS } from "../domain/Billing.ts"
import type { ChainReads } from "./ChainReads.ts"
import {
  type Discrepancy,
  isTxHash,
  MAX_RECORDED,
  splitDiscrepancies,
  type TxTransfers
} from "./Discrepancies.ts"

/**
 * The checks of a reconciliation run (the list is on `Reconciliation`), each a read of the ledger held
 * against the chain or against itself. Each answers its discrepancies; the transfer checks also the
 * treasury's movement in the transactions they read, for the treasury check.
 */
export interface CheckSources {
  readonly sql: SqlClient.SqlClient
  readonly chain: ChainShape
  readonly reads: ChainReads
}

const sum = (values: ReadonlyArray<bigint>) => values.reduce((a, b) => a + b, 0n)

/** What left the treasury (or the router signer, D16) in a transaction, and how much of it went to `to`. */
const treasuryOutflow = (chain: ChainShape, tx: TxTransfers, to: Address) => {
  const senders = [chain.treasury, chain.routerSigner]
  const outflow = tx.transfers.filter((t) => senders.some((s) => isAddressEqual(t.from, s)))
  return {
    out: sum(outflow.map((t) => t.value)),
    sent: sum(outflow.filter((t) => isAddressEqual(t.to, to)).map((t) => t.value))
  }
}

/** Every landed x402 authorization: its transfer payer → treasury, its settled row, and where its value went. */
export const checkSettlements = ({ sql, chain, reads }: CheckSources) =>
  Effect.gen(function* () {
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
      const tx = yield* reads.transfersOf(row.tx_hash)
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

/** Every paid refund batch: its transfer treasury → payer and its refund_paid rows. */
export const checkRefunds = ({ sql, chain, reads }: CheckSources) =>
  Effect.gen(function* () {
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
      const tx = yield* reads.transfersOf(row.tx_hash)
      if (tx.status !== "success") {
        out.push({ ...base, kind: "refund_tx_missing", detail: `the transaction is ${tx.status} on chain` })
        continue
      }
      const { out: moved, sent } = treasuryOutflow(chain, tx, row.payer)
      chainOut += moved
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

/** Every paid provider payout: its transfer to the provider's signer, its provider_paid row and the shares it pays. */
export const checkPayouts = ({ sql, chain, reads }: CheckSources) =>
  Effect.gen(function* () {
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
      const tx = yield* reads.transfersOf(row.tx_hash)
      if (tx.status !== "success") {
        out.push({
          ...base,
          kind: "payout_tx_missing",
          detail: `${provider}: the transaction is ${tx.status} on chain`
        })
        continue
      }
      const { out: moved, sent } = treasuryOutflow(chain, tx, row.to_address)
      chainOut += moved
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

/** The treasury's net movement on chain (in the transactions the checks above read) against the ledger's. */
export const checkTreasury = (sql: SqlClient.SqlClient, chainIn: bigint, chainOut: bigint) =>
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

/**
 * Every captured request: router fee + provider share = capture = the charge, the fee at its rate. Only the
 * rows that break an identity come back; the fee rule mirrors Billing.feeSplit (half up).
 */
export const checkFees = (sql: SqlClient.SqlClient) =>
  sql<{
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

/** Every closed epoch: its root is the one anchored on chain, and every receipt of it is in it. */
export const checkEpochs = ({ sql, reads }: CheckSources) =>
  Effect.gen(function* () {
    const out: Array<Discrepancy> = []
    const closed = yield* sql<{ epoch_id: string; root: string }>`
      SELECT epoch_id::text AS epoch_id, root FROM epochs WHERE status = 'closed' ORDER BY epoch_id
    `.pipe(Effect.orDie)
    for (const epoch of closed) {
      const onChain = yield* reads.anchoredRoot(BigInt(epoch.epoch_id), epoch.root)
      if (onChain.toLowerCase() !== epoch.root.toLowerCase()) {
        out.push({
          kind: "epoch_root_mismatch",
          epoch_id: Number(epoch.epoch_id),
          expected: epoch.root,
          actual: onChain,
          detail: "the recorded epoch root is not the one anchored on chain"
        })
      }
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
