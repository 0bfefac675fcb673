import { Context, Effect, Layer } from "effect"
import type { Address, Hash, Hex } from "viem"
import {
  Chain,
  type ChainError,
  type TransactionOutcome,
  type TransferAuthorization
} from "../chain/Chain.ts"
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

const attributes = (transfer: OutgoingTransfer): Record<string, string> => {
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
 * The one way money (or an anchor) leaves the router: x402 settlement submissions (`exact` and `upto`), refund batches,
 * provider payouts, withdrawals and epoch anchors. Callers keep their own records (hash recorded
 * before the receipt is awaited, resume and adoption rules); this module is where a send happens.
 */
export class Treasury extends Context.Service<
  Treasury,
  {
    /** Broadcasts one transfer; returns its hash once broadcast, not mined. */
    readonly send: (transfer: OutgoingTransfer) => Effect.Effect<Hash, ChainError>
    /** Waits for a broadcast transfer to be mined. */
    readonly confirm: (hash: Hash) => Effect.Effect<TransactionOutcome, ChainError>
  }
>()("router/ledger/Treasury") {
  static readonly layer = Layer.effect(
    Treasury,
    Effect.gen(function* () {
      const chain = yield* Chain

      const broadcast = (transfer: OutgoingTransfer): Effect.Effect<Hash, ChainError> => {
        switch (transfer._tag) {
          case "X402Settlement":
            return chain.submitTransferWithAuthorization(transfer.authorization)
          case "UptoSettlement":
            return chain.submitUptoSettlement(transfer.permit, transfer.amount)
          case "RefundBatch":
          case "ProviderPayout":
          case "Withdrawal":
            return chain.transferFromTreasury(transfer.to, transfer.amount)
          case "EpochAnchor":
            return chain.anchorEpoch(transfer.epochId, transfer.root)
        }
      }

      const send = (transfer: OutgoingTransfer) =>
        broadcast(transfer).pipe(Effect.withSpan("Treasury.send", { attributes: attributes(transfer) }))

      return Treasury.of({ send, confirm: chain.waitForReceipt })
    })
  )
}
