/**
 * The EIP-712 digest of a receipt, computed directly with the WebAssembly keccak of `Keccak.ts` (noble's,
 * the one viem uses, until it is ready; D480). Kept apart from `Receipt.ts` (which re-exports it) from
 * the days a worker thread loaded it without viem or effect (D391); receipts are now signed on the main
 * thread (D433).
 */
import { keccak256Bytes } from "./Keccak.ts"

/**
 * What the digest reads of a receipt: `Receipt.ts`'s `ReceiptBody`, field for field (this module cannot
 * import it, even as a type: `Receipt.ts` imports this one).
 */
export interface DigestedReceipt {
  readonly request_id: string
  readonly wallet: string
  readonly provider_id: string
  readonly model_class: string
  readonly in_tokens: number
  readonly out_tokens: number
  readonly cached_tokens: number
  readonly price_in: number
  readonly price_out: number
  readonly price_in_cached: number | null
  readonly charged: number
  readonly authorized: number
  readonly payment_ref: string
  readonly refund_ref: string | null
  readonly ttft_ms: number
  readonly status: string
  readonly settlement: string
  readonly epoch_id: number
  readonly session_id: string | null
  readonly quotes_competing: number
  readonly created_at: number
}

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

const utf8 = new TextEncoder()
const keccak = keccak256Bytes
const RECEIPT_TYPEHASH = keccak(
  utf8.encode(`Receipt(${receiptTypes.Receipt.map((f) => `${f.type} ${f.name}`).join(",")})`)
)
const DOMAIN_TYPEHASH = keccak(utf8.encode("EIP712Domain(string name,string version,uint256 chainId)"))
const domainSeparators = new Map<number, Uint8Array>()
const ADDRESS = /^0x[0-9a-fA-F]{40}$/

/** Writes a non-negative safe integer as a big-endian uint256 word. */
const putUint = (view: DataView, word: number, n: number) => {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`uint256 field out of range: ${n}`)
  view.setUint32(word * 32 + 24, Math.floor(n / 2 ** 32))
  view.setUint32(word * 32 + 28, n >>> 0)
}
const putString = (out: Uint8Array, word: number, text: string) =>
  out.set(keccak(utf8.encode(text)), word * 32)

/**
 * The hashes of the fields that repeat from receipt to receipt (provider, model class, cached price,
 * status, settlement): a keccak is ~1 µs in WebAssembly, a map lookup less. Bounded: past
 * `REPEATED_LIMIT` distinct values the map starts over. Not the refund reference or the session: their
 * values (a transaction hash, a payer's balance, a session id) belong to one receipt or a few, and kept
 * here they would only push the repeating ones out; only their empty value repeats, and it is
 * `EMPTY_HASH`.
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
/** How many field hashes `repeatedHashes` holds (a test reads it). */
export const repeatedHashesHeld = () => repeatedHashes.size

const EMPTY_HASH = keccak(new Uint8Array(0))
/** A field whose value is mostly absent (hashed as ""): the absent value's hash is kept, others are hashed. */
const putOptionalString = (out: Uint8Array, word: number, text: string | null) =>
  text === null || text === "" ? out.set(EMPTY_HASH, word * 32) : putString(out, word, text)

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
export const receiptDigestBytes = (receipt: DigestedReceipt, chainId: number): Uint8Array => {
  const out = new Uint8Array(22 * 32)
  const view = new DataView(out.buffer)
  out.set(RECEIPT_TYPEHASH, 0)
  putString(out, 1, receipt.request_id)
  if (!ADDRESS.test(receipt.wallet)) throw new RangeError("receipt wallet is not a 20-byte address")
  out.set(Buffer.from(receipt.wallet.slice(2), "hex"), 2 * 32 + 12)
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
  putOptionalString(out, 14, receipt.refund_ref)
  putUint(view, 15, receipt.ttft_ms)
  putRepeatedString(out, 16, receipt.status)
  putRepeatedString(out, 17, receipt.settlement)
  putUint(view, 18, receipt.epoch_id)
  putOptionalString(out, 19, receipt.session_id)
  putUint(view, 20, receipt.quotes_competing)
  putUint(view, 21, receipt.created_at)
  const envelope = new Uint8Array(2 + 64)
  envelope[0] = 0x19
  envelope[1] = 0x01
  envelope.set(domainSeparator(chainId), 2)
  envelope.set(keccak(out), 34)
  return keccak(envelope)
}

export const receiptDigest = (receipt: DigestedReceipt, chainId: number): `0x${string}` =>
  `0x${Buffer.from(receiptDigestBytes(receipt, chainId)).toString("hex")}`
