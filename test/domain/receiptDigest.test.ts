import { assert, beforeAll, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Hex, hashTypedData, recoverTypedDataAddress, verifyTypedData } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { keccakEngine, keccakReady } from "../../src/domain/Keccak.ts"
import {
  type ReceiptBody,
  receiptDigest,
  receiptTypedData,
  repeatedHashesHeld
} from "../../src/domain/Receipt.ts"
import { arbitraryReceipt, safeUint } from "../support/Receipts.ts"

const chainIds = fc.oneof(fc.constantFrom(1, 8453, 31337, 84532), fc.integer({ min: 1, max: 2 ** 31 }))

describe("receipt digest (properties)", () => {
  beforeAll(() => keccakReady)

  it("is viem's hashTypedData of the receipt's typed data (hashed with the WebAssembly keccak)", () => {
    assert.strictEqual(keccakEngine(), "wasm")
    fc.assert(
      fc.property(arbitraryReceipt, chainIds, (receipt, chainId) => {
        assert.strictEqual(receiptDigest(receipt, chainId), hashTypedData(receiptTypedData(receipt, chainId)))
      }),
      { numRuns: 300 }
    )
  })

  it("is viem's hashTypedData for repeated field values, past the bound of kept field hashes too", () => {
    // Few providers and statuses (as in real traffic), then more distinct values than are kept.
    const few = fc
      .sample(arbitraryReceipt, 200)
      .map((r, i) => ({ ...r, provider_id: `p${i % 3}`, session_id: null }))
    const many = fc.sample(arbitraryReceipt, 700).map((r, i) => ({ ...r, provider_id: `provider ${i}` }))
    for (const receipt of [...few, ...many, ...few]) {
      assert.strictEqual(receiptDigest(receipt, 8453), hashTypedData(receiptTypedData(receipt, 8453)))
    }
  })

  it("keeps no hash of a refund reference or a session id: they belong to one receipt or a few", () => {
    const fixed = {
      provider_id: "p0",
      model_class: "chat-small",
      status: "ok",
      settlement: "landed"
    } as const
    const [first, ...rest] = fc.sample(arbitraryReceipt, 301).map(
      (r, i): ReceiptBody => ({
        ...r,
        ...fixed,
        price_in_cached: null,
        refund_ref: `0x${i.toString(16).padStart(64, "0")}`,
        session_id: `sess_${i}`
      })
    )
    // The repeating fields' hashes are kept by the first receipt (which may start the map over).
    receiptDigest(first!, 8453)
    const held = repeatedHashesHeld()
    for (const receipt of rest) {
      assert.strictEqual(receiptDigest(receipt, 8453), hashTypedData(receiptTypedData(receipt, 8453)))
      assert.strictEqual(repeatedHashesHeld(), held)
    }
  })

  it("signed as a digest, it is byte for byte viem's signTypedData, and viem recovers the signer", async () => {
    await fc.assert(
      fc.asyncProperty(
        arbitraryReceipt,
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
      fc.property(arbitraryReceipt, safeUint, (receipt, n) => {
        const changed: ReceiptBody = { ...receipt, charged: receipt.charged === n ? n + 1 : n }
        assert.notStrictEqual(receiptDigest(changed, 1), receiptDigest(receipt, 1) as Hex)
      })
    )
  })
})
