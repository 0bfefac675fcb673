/**
 * What the router sends (`Treasury` sends it): every outgoing transfer named by its purpose and the
 * record it settles, the purpose key and span attributes that name one, and how a sent one ends.
 */
import { createHash } from "node:crypto"
import type { Address, Hex } from "viem"
import type { TransferAuthorization } from "../chain/Chain.ts"
import type { UptoPermit } from "../chain/UptoPermit.ts"

/**
 * Every transfer the router sends, named by what it is for and by the record it settles, so that
 * one module can make each of them exactly once.
 */
export type OutgoingTransfer =
  /** A captured x402 `exact` authorization, submitted by the router signer (payer → treasury). */
  | {
      readonly _tag: "X402Settlement"
      readonly requestId: string
      readonly authorization: TransferAuthorization
    }
  /**
   * A captured x402 `upto` authorization: exactly the charged `amount` (at most the signed ceiling) moves
   * payer → treasury through the upto proxy, sent by the router signer as the witness's facilitator.
   * Permit2 spends the nonce with it, so one authorization can never transfer twice.
   */
  | {
      readonly _tag: "UptoSettlement"
      readonly requestId: string
      readonly permit: UptoPermit
      readonly amount: bigint
    }
  /** The overage of a payer's ended requests, batched (treasury → payer). */
  | {
      readonly _tag: "RefundBatch"
      readonly to: Address
      readonly amount: bigint
      readonly requestIds: ReadonlyArray<string>
    }
  /** A provider's final shares (treasury → the provider's registered signer). */
  | {
      readonly _tag: "ProviderPayout"
      readonly payoutId: string
      readonly to: Address
      readonly amount: bigint
    }
  /** A prepaid-credit withdrawal (treasury → the address the owner signed). */
  | {
      readonly _tag: "Withdrawal"
      readonly withdrawalId: string
      readonly to: Address
      readonly amount: bigint
    }
  /** An epoch's Merkle root, anchored by the router signer. */
  | { readonly _tag: "EpochAnchor"; readonly epochId: bigint; readonly root: Hex }

/**
 * The one key of a transfer: at most one live transaction per purpose, ever (docs/decisions.md D166).
 * A refund batch is named by its payer and the exact set of refunds it pays, so the same claim always
 * has the same purpose and a re-grouped one a new purpose.
 */
export const purposeOf = (transfer: OutgoingTransfer): string => {
  switch (transfer._tag) {
    case "X402Settlement":
      return `x402:${transfer.requestId}`
    case "UptoSettlement":
      return `upto:${transfer.requestId}`
    case "RefundBatch": {
      const digest = createHash("sha256")
        .update([...transfer.requestIds].sort().join("\n"))
        .digest("hex")
        .slice(0, 32)
      return `refund:${transfer.to.toLowerCase()}:${digest}`
    }
    case "ProviderPayout":
      return `payout:${transfer.payoutId}`
    case "Withdrawal":
      return `withdrawal:${transfer.withdrawalId}`
    case "EpochAnchor":
      return `anchor:${transfer.epochId.toString()}`
  }
}

export const attributes = (transfer: OutgoingTransfer): Record<string, string> => {
  switch (transfer._tag) {
    case "X402Settlement":
    case "UptoSettlement":
      return { purpose: transfer._tag, request_id: transfer.requestId }
    case "RefundBatch":
      return { purpose: transfer._tag, refunds: String(transfer.requestIds.length) }
    case "ProviderPayout":
      return { purpose: transfer._tag, payout_id: transfer.payoutId }
    case "Withdrawal":
      return { purpose: transfer._tag, withdrawal_id: transfer.withdrawalId }
    case "EpochAnchor":
      return { purpose: transfer._tag, epoch: transfer.epochId.toString() }
  }
}

/**
 * How a sent transfer ended. `replaced`: its nonce was taken by another transaction, so it can never be
 * mined; like `reverted`, it moved nothing, and a later `send` for the same purpose signs a new attempt.
 */
export type TransferOutcome =
  | { readonly status: "success" | "reverted"; readonly blockNumber: bigint }
  | { readonly status: "replaced" }
