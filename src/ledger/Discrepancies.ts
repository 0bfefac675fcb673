import type { Address, Hash } from "viem"

/** What reconciliation compares and how it names a difference: the discrepancy kinds, the rows it reads, and the pure checks over them. */
export type DiscrepancyKind =
  | "settlement_tx_missing"
  | "settlement_transfer_mismatch"
  | "settlement_ledger_mismatch"
  | "authorization_split_mismatch"
  | "session_spend_mismatch"
  | "refund_tx_missing"
  | "refund_transfer_mismatch"
  | "refund_ledger_mismatch"
  | "payout_tx_missing"
  | "payout_transfer_mismatch"
  | "payout_ledger_mismatch"
  | "fee_split_mismatch"
  | "treasury_mismatch"
  | "epoch_root_mismatch"
  | "receipt_not_anchored"
  | "chain_unreachable"
  | "reconciliation_error"

/** One thing the ledger and the chain disagree on, naming the request and/or transaction. */
export interface Discrepancy {
  readonly kind: DiscrepancyKind
  readonly request_id?: string | undefined
  readonly request_ids?: ReadonlyArray<string> | undefined
  readonly tx?: string | undefined
  readonly payout_id?: string | undefined
  readonly epoch_id?: number | undefined
  /** What the book of record says (base units or hash). */
  readonly expected?: string | undefined
  /** What was found (on chain, or in the other ledger rows). */
  readonly actual?: string | undefined
  readonly detail: string
}

/** How many discrepancies a run records (and a listing check reads) at the most. */
export const MAX_RECORDED = 50

export interface ReconciliationResult {
  readonly id: number
  readonly status: "ok" | "failed"
  /** The first discrepancies (at most `MAX_RECORDED`), in check order. */
  readonly discrepancies: ReadonlyArray<Discrepancy>
}

export interface TxTransfers {
  readonly status: "missing" | "reverted" | "success"
  readonly transfers: ReadonlyArray<{ readonly from: Address; readonly to: Address; readonly value: bigint }>
}

export const isTxHash = (value: string | null): value is Hash =>
  value !== null && /^0x[0-9a-fA-F]{64}$/.test(value)

export interface Split {
  readonly value: string
  readonly captured: string
  readonly refund_due: string
  readonly session_id: string | null
  readonly session_status: string | null
  readonly budget: string | null
  readonly spent: string | null
  readonly session_captured: string
}

/**
 * Where a landed authorization's value went. A plain request: its capture + refund due. A session's
 * funding: the session budget, spent by the captures of all its turns, the rest refunded at close.
 */
export const splitDiscrepancies = (row: Split, base: { request_id: string; tx: string | undefined }) => {
  const out: Array<Discrepancy> = []
  const add = (kind: DiscrepancyKind, expected: bigint, actual: bigint, detail: string) => {
    if (expected !== actual) {
      out.push({ ...base, kind, expected: expected.toString(), actual: actual.toString(), detail })
    }
  }
  const value = BigInt(row.value)
  const refundDue = BigInt(row.refund_due)
  if (row.session_id === null) {
    add(
      "authorization_split_mismatch",
      value,
      BigInt(row.captured) + refundDue,
      "capture + refund due ≠ value"
    )
    return out
  }
  const captured = BigInt(row.session_captured)
  const session = `session ${row.session_id}`
  add("authorization_split_mismatch", value, BigInt(row.budget ?? "0"), `${session}: budget ≠ its funding`)
  add("session_spend_mismatch", BigInt(row.spent ?? "0"), captured, `${session}: spend ≠ its turns' captures`)
  if (row.session_status === "closed") {
    add(
      "authorization_split_mismatch",
      value,
      captured + refundDue,
      `${session}: captures + refund ≠ funding`
    )
  }
  return out
}
