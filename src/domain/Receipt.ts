import { Schema } from "effect"
import { type Address, type Hex, hexToBytes, keccak256, type TypedDataDefinition, toHex } from "viem"

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

export const RECEIPT_DOMAIN_NAME = "svc Receipt"
export const RECEIPT_DOMAIN_VERSION = "1"

export const receiptTypes = {
  Receipt: [
    { name: "requestId", type: "string" },
    { name: "wallet", type: "address" },
    { name: "providerId", type: "string" },
    { name: "modelClass", type: "string" },
    { name: "inTokens", type: "uint256" },
    { name: "outTokens", type: "uint256" },
    { name: "cachedTokens", type: "uint256" },
    { name: "priceIn", type: "uint256" },
    { name: "priceOut", type: "uint256" },
    { name: "priceInCached", type: "string" },
    { name: "charged", type: "uint256" },
    { name: "authorized", type: "uint256" },
    { name: "paymentRef", type: "string" },
    { name: "refundRef", type: "string" },
    { name: "ttftMs", type: "uint256" },
    { name: "status", type: "string" },
    { name: "settlement", type: "string" },
    { name: "epochId", type: "uint256" },
    { name: "sessionId", type: "string" },
    { name: "quotesCompeting", type: "uint256" },
    { name: "createdAt", type: "uint256" }
  ]
} as const

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

const utf8 = new TextEncoder()
const keccak = (bytes: Uint8Array) => keccak256(bytes, "bytes")
const RECEIPT_TYPEHASH = keccak(
  utf8.encode(`Receipt(${receiptTypes.Receipt.map((f) => `${f.type} ${f.name}`).join(",")})`)
)
const DOMAIN_TYPEHASH = keccak(utf8.encode("EIP712Domain(string name,string version,uint256 chainId)"))
const domainSeparators = new Map<number, Uint8Array>()

/** Writes a non-negative safe integer as a big-endian uint256 word. */
const putUint = (view: DataView, word: number, n: number) => {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`uint256 field out of range: ${n}`)
  view.setUint32(word * 32 + 24, Math.floor(n / 2 ** 32))
  view.setUint32(word * 32 + 28, n >>> 0)
}
const putString = (out: Uint8Array, word: number, text: string) =>
  out.set(keccak(utf8.encode(text)), word * 32)

/**
 * The hashes of the fields that repeat from receipt to receipt (provider, model class, status,
 * settlement, an empty reference or session): each keccak is pure JS, and these are 7 of a
 * receipt's 11. Bounded: past `REPEATED_LIMIT` distinct values the map starts over.
 */
const repeatedHashes = new Map<string, Uint8Array>()
const REPEATED_LIMIT = 512
const putRepeatedString = (out: Uint8Array, word: number, text: string) => {
  let hash = repeatedHashes.get(text)
  if (hash === undefined) {
    if (repeatedHashes.size >= REPEATED_LIMIT) repeatedHashes.clear()
    hash = keccak(utf8.encode(text))
    repeatedHashes.set(text, hash)
  }
  out.set(hash, word * 32)
}

const domainSeparator = (chainId: number) => {
  let separator = domainSeparators.get(chainId)
  if (separator === undefined) {
    const out = new Uint8Array(4 * 32)
    out.set(DOMAIN_TYPEHASH, 0)
    putString(out, 1, RECEIPT_DOMAIN_NAME)
    putString(out, 2, RECEIPT_DOMAIN_VERSION)
    putUint(new DataView(out.buffer), 3, chainId)
    separator = keccak(out)
    domainSeparators.set(chainId, separator)
  }
  return separator
}

/**
 * The EIP-712 digest of `receiptTypedData(receipt, chainId)`, computed directly: the type hash and
 * the domain separator once, then one word per field in `receiptTypes` order. It is what viem's
 * `hashTypedData` computes (test/domain/receiptDigest.test.ts checks it over arbitrary receipts),
 * at a fraction of the cost: viem validates and ABI-encodes generically on every call.
 */
export const receiptDigest = (receipt: ReceiptBody, chainId: number): Hex => {
  const out = new Uint8Array(22 * 32)
  const view = new DataView(out.buffer)
  out.set(RECEIPT_TYPEHASH, 0)
  putString(out, 1, receipt.request_id)
  const wallet = hexToBytes(receipt.wallet as Hex)
  if (wallet.length !== 20) throw new RangeError("receipt wallet is not a 20-byte address")
  out.set(wallet, 2 * 32 + 12)
  putRepeatedString(out, 3, receipt.provider_id)
  putRepeatedString(out, 4, receipt.model_class)
  putUint(view, 5, receipt.in_tokens)
  putUint(view, 6, receipt.out_tokens)
  putUint(view, 7, receipt.cached_tokens)
  putUint(view, 8, receipt.price_in)
  putUint(view, 9, receipt.price_out)
  putRepeatedString(out, 10, receipt.price_in_cached === null ? "" : String(receipt.price_in_cached))
  putUint(view, 11, receipt.charged)
  putUint(view, 12, receipt.authorized)
  putString(out, 13, receipt.payment_ref)
  putRepeatedString(out, 14, receipt.refund_ref ?? "")
  putUint(view, 15, receipt.ttft_ms)
  putRepeatedString(out, 16, receipt.status)
  putRepeatedString(out, 17, receipt.settlement)
  putUint(view, 18, receipt.epoch_id)
  putRepeatedString(out, 19, receipt.session_id ?? "")
  putUint(view, 20, receipt.quotes_competing)
  putUint(view, 21, receipt.created_at)
  const envelope = new Uint8Array(2 + 64)
  envelope[0] = 0x19
  envelope[1] = 0x01
  envelope.set(domainSeparator(chainId), 2)
  envelope.set(keccak(out), 34)
  return toHex(keccak(envelope))
}

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
