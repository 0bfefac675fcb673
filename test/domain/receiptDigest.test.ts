import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Hex, hashTypedData, recoverTypedDataAddress, verifyTypedData } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { type ReceiptBody, receiptDigest, receiptTypedData } from "../../src/domain/Receipt.ts"

const uint = fc.maxSafeNat()
const text = fc.string({ unit: "grapheme", maxLength: 40 })
const address = fc
  .uint8Array({ minLength: 20, maxLength: 20 })
  .map((bytes) => `0x${Buffer.from(bytes).toString("hex")}` as const)

/** Any receipt the schema admits with non-negative figures (receipts never carry a negative one). */
const receipts: fc.Arbitrary<ReceiptBody> = fc.record({
  request_id: text,
  wallet: address,
  provider_id: text,
  model_class: text,
  in_tokens: uint,
  out_tokens: uint,
  cached_tokens: uint,
  price_in: uint,
  price_out: uint,
  price_in_cached: fc.option(uint, { nil: null }),
  charged: uint,
  authorized: uint,
  payment_ref: text,
  refund_ref: fc.option(text, { nil: null }),
  ttft_ms: uint,
  status: fc.constantFrom("ok", "partial", "released"),
  settlement: fc.constantFrom("pending", "landed", "none", "failed"),
  epoch_id: uint,
  session_id: fc.option(text, { nil: null }),
  quotes_competing: uint,
  created_at: uint
})
const chainIds = fc.oneof(fc.constantFrom(1, 8453, 31337, 84532), fc.integer({ min: 1, max: 2 ** 31 }))

describe("receipt digest (properties)", () => {
  it("is viem's hashTypedData of the receipt's typed data", () => {
    fc.assert(
      fc.property(receipts, chainIds, (receipt, chainId) => {
        assert.strictEqual(receiptDigest(receipt, chainId), hashTypedData(receiptTypedData(receipt, chainId)))
      }),
      { numRuns: 300 }
    )
  })

  it("is viem's hashTypedData for repeated field values, past the bound of kept field hashes too", () => {
    // Few providers and statuses (as in real traffic), then more distinct values than are kept.
    const few = fc.sample(receipts, 200).map((r, i) => ({ ...r, provider_id: `p${i % 3}`, session_id: null }))
    const many = fc.sample(receipts, 700).map((r, i) => ({ ...r, provider_id: `provider ${i}` }))
    for (const receipt of [...few, ...many, ...few]) {
      assert.strictEqual(receiptDigest(receipt, 8453), hashTypedData(receiptTypedData(receipt, 8453)))
    }
  })

  it("signed as a digest, it is byte for byte viem's signTypedData, and viem recovers the signer", async () => {
    await fc.assert(
      fc.asyncProperty(
        receipts,
        chainIds,
        fc.constant(null).map(() => generatePrivateKey()),
        async (receipt, chainId, key) => {
          const account = privateKeyToAccount(key)
          const typedData = receiptTypedData(receipt, chainId)
          const fast = await account.sign({ hash: receiptDigest(receipt, chainId) })
          assert.strictEqual(fast, await account.signTypedData(typedData))
          assert.strictEqual(
            await recoverTypedDataAddress({ ...typedData, signature: fast }),
            account.address
          )
          assert.isTrue(await verifyTypedData({ ...typedData, address: account.address, signature: fast }))
        }
      ),
      { numRuns: 60 }
    )
  })

  it("changes when any field changes", () => {
    fc.assert(
      fc.property(receipts, uint, (receipt, n) => {
        const changed: ReceiptBody = { ...receipt, charged: receipt.charged === n ? n + 1 : n }
        assert.notStrictEqual(receiptDigest(changed, 1), receiptDigest(receipt, 1) as Hex)
      })
    )
  })
})
