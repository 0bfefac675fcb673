import fc from "fast-check"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"

export const safeUint = fc.maxSafeNat()
const text = fc.string({ unit: "grapheme", maxLength: 40 })
const address = fc
  .uint8Array({ minLength: 20, maxLength: 20 })
  .map((bytes) => `0x${Buffer.from(bytes).toString("hex")}` as const)

/** Any receipt the schema admits with non-negative figures (receipts never carry a negative one). */
export const arbitraryReceipt: fc.Arbitrary<ReceiptBody> = fc.record({
  request_id: text,
  wallet: address,
  provider_id: text,
  model_class: text,
  in_tokens: safeUint,
  out_tokens: safeUint,
  cached_tokens: safeUint,
  price_in: safeUint,
  price_out: safeUint,
  price_in_cached: fc.option(safeUint, { nil: null }),
  charged: safeUint,
  authorized: safeUint,
  payment_ref: text,
  refund_ref: fc.option(text, { nil: null }),
  ttft_ms: safeUint,
  status: fc.constantFrom("ok", "partial", "released"),
  settlement: fc.constantFrom("pending", "landed", "none", "failed"),
  epoch_id: safeUint,
  session_id: fc.option(text, { nil: null }),
  quotes_competing: safeUint,
  created_at: safeUint
})
