import { Schema } from "effect"
import type { Address, TypedDataDefinition } from "viem"
import { RECEIPT_DOMAIN_NAME, RECEIPT_DOMAIN_VERSION, receiptTypes } from "./ReceiptDigest.ts"

export {
  RECEIPT_DOMAIN_NAME,
  RECEIPT_DOMAIN_VERSION,
  receiptDigest,
  receiptTypes,
  repeatedHashesHeld
} from "./ReceiptDigest.ts"

/** Spec 2.8. Holds no prompt and no reply. */
export const ReceiptBody = Schema.Struct({
  request_id: Schema.String,
  wallet: Schema.String,
  provider_id: Schema.String,
  model_class: Schema.String,
  in_tokens: Schema.Int,
  out_tokens: Schema.Int,
  cached_tokens: Schema.Int,
  price_in: Schema.Int,
  price_out: Schema.Int,
  price_in_cached: Schema.NullOr(Schema.Int),
  charged: Schema.Int,
  authorized: Schema.Int,
  payment_ref: Schema.String,
  refund_ref: Schema.NullOr(Schema.String),
  ttft_ms: Schema.Int,
  /** `ok` served in full; `partial` ended early (delivered tokens charged); `released` nothing served or charged. */
  status: Schema.Literals(["ok", "partial", "released"]),
  /** `pending` until the payment lands; `landed` once mined (or drawn from a balance); `none` when released. */
  settlement: Schema.Literals(["pending", "landed", "none", "failed"]),
  epoch_id: Schema.Int,
  session_id: Schema.NullOr(Schema.String),
  quotes_competing: Schema.Int,
  created_at: Schema.Int
})
export type ReceiptBody = typeof ReceiptBody.Type

/**
 * The EIP-712 typed data the router signs for a receipt (docs/protocol.md). Nullable fields
 * are strings: `""` for null, decimal otherwise, so a verifier needs nothing but viem.
 */
export const receiptTypedData = (receipt: ReceiptBody, chainId: number) =>
  ({
    domain: { name: RECEIPT_DOMAIN_NAME, version: RECEIPT_DOMAIN_VERSION, chainId },
    types: receiptTypes,
    primaryType: "Receipt",
    message: {
      requestId: receipt.request_id,
      wallet: receipt.wallet as Address,
      providerId: receipt.provider_id,
      modelClass: receipt.model_class,
      inTokens: BigInt(receipt.in_tokens),
      outTokens: BigInt(receipt.out_tokens),
      cachedTokens: BigInt(receipt.cached_tokens),
      priceIn: BigInt(receipt.price_in),
      priceOut: BigInt(receipt.price_out),
      priceInCached: receipt.price_in_cached === null ? "" : String(receipt.price_in_cached),
      charged: BigInt(receipt.charged),
      authorized: BigInt(receipt.authorized),
      paymentRef: receipt.payment_ref,
      refundRef: receipt.refund_ref ?? "",
      ttftMs: BigInt(receipt.ttft_ms),
      status: receipt.status,
      settlement: receipt.settlement,
      epochId: BigInt(receipt.epoch_id),
      sessionId: receipt.session_id ?? "",
      quotesCompeting: BigInt(receipt.quotes_competing),
      createdAt: BigInt(receipt.created_at)
    }
  }) satisfies TypedDataDefinition<typeof receiptTypes, "Receipt">

/** The typed data of a receipt as JSON (`typed_data` of `GET /v1/receipts/:id`; uint256 as decimal strings). */
export const ReceiptTypedDataJson = Schema.Struct({
  domain: Schema.Struct({ name: Schema.String, version: Schema.String, chainId: Schema.Number }),
  types: Schema.Record(
    Schema.String,
    Schema.Array(Schema.Struct({ name: Schema.String, type: Schema.String }))
  ),
  primaryType: Schema.String,
  message: Schema.Record(Schema.String, Schema.String)
})

/** JSON form of the typed data for clients (bigints as decimal strings). */
export const receiptTypedDataJson = (
  receipt: ReceiptBody,
  chainId: number
): typeof ReceiptTypedDataJson.Type =>
  JSON.parse(
    JSON.stringify(receiptTypedData(receipt, chainId), (_k, v) => (typeof v === "bigint" ? v.toString() : v))
  )

/** How a receipt is in its epoch's root anchored on chain (docs/protocol.md section 3); null until then. */
export const ReceiptInclusion = Schema.Struct({
  epoch_id: Schema.Int,
  leaf: Schema.String,
  proof: Schema.Array(Schema.String),
  root: Schema.String,
  anchor_tx: Schema.String,
  anchor_contract: Schema.String,
  chain_id: Schema.Int
})

/** `GET /v1/receipts/:id`: the receipt, its signature and signer, the typed data, and its inclusion proof. */
export const ReceiptReply = Schema.Struct({
  receipt: ReceiptBody,
  final: Schema.Boolean,
  signature: Schema.NullOr(Schema.String),
  signer: Schema.String,
  typed_data: ReceiptTypedDataJson,
  inclusion: Schema.NullOr(ReceiptInclusion)
})
export type ReceiptReply = typeof ReceiptReply.Type
