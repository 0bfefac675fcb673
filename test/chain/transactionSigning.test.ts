import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { getAddress, type Hex, hexToBytes, keccak256, numberToHex } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { signEip1559, yParityOf } from "../../src/chain/TransactionSigning.ts"
import { keccakEngine, keccakReady } from "../../src/domain/Keccak.ts"

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
const privateKey = fc.bigInt(1n, SECP256K1_N - 1n).map((d) => numberToHex(d, { size: 32 }))
const hexBytes = (minLength: number, maxLength: number) =>
  fc.uint8Array({ minLength, maxLength }).map((b) => `0x${Buffer.from(b).toString("hex")}` as Hex)

/** Every field of the router's contract calls, over its whole range (small values weighted in). */
const eip1559Call = fc
  .record({
    chainId: fc.oneof(fc.constantFrom(1, 8453, 31337, 84532), fc.integer({ min: 1, max: 2 ** 32 })),
    nonce: fc.oneof(fc.integer({ min: 0, max: 300 }), fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER })),
    to: hexBytes(20, 20).map((address) => getAddress(address)),
    data: fc.oneof(hexBytes(0, 8), hexBytes(0, 600)),
    gas: fc.oneof(fc.bigInt(21_000n, 500_000n), fc.bigInt(0n, 2n ** 64n - 1n)),
    fees: fc.oneof(fc.bigInt(0n, 10n ** 11n), fc.bigInt(0n, 2n ** 128n)).chain((maxFeePerGas) =>
      fc.record({
        maxFeePerGas: fc.constant(maxFeePerGas),
        // A tip above the fee cap is refused by viem's serializer, on both sides.
        maxPriorityFeePerGas: fc.oneof(
          fc.constant(0n),
          fc.constant(maxFeePerGas),
          fc.bigInt(0n, maxFeePerGas)
        )
      })
    )
  })
  .map(({ fees, ...call }) => ({ ...call, ...fees }))

describe("EIP-1559 transactions signed in WebAssembly (D486)", () => {
  it("gives viem's signTransaction bytes and hash, byte for byte", async () => {
    await keccakReady
    assert.strictEqual(keccakEngine(), "wasm", "the WebAssembly keccak is the one compared")
    await fc.assert(
      fc.asyncProperty(privateKey, eip1559Call, async (key, call) => {
        const expected = await privateKeyToAccount(key).signTransaction({
          type: "eip1559",
          value: 0n,
          ...call
        })
        const signed = signEip1559(call, hexToBytes(key))
        assert.strictEqual(signed.raw, expected)
        assert.strictEqual(signed.hash, keccak256(expected))
      }),
      { numRuns: 300 }
    )
  })

  it("one key over many transactions, and every field changes the bytes", async () => {
    const key = hexToBytes(numberToHex(0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80n))
    const base = {
      chainId: 31337,
      nonce: 7,
      to: getAddress("0x5fbdb2315678afecb367f032d93f642f64180aa3"),
      data: "0xa9059cbb" as Hex,
      gas: 60_000n,
      maxFeePerGas: 2_000_000_000n,
      maxPriorityFeePerGas: 1_000_000_000n
    }
    const hashes = new Set(
      [
        base,
        { ...base, chainId: 1 },
        { ...base, nonce: 8 },
        { ...base, to: getAddress("0x5fbdb2315678afecb367f032d93f642f64180aa4") },
        { ...base, data: "0xa9059cbc" as Hex },
        { ...base, gas: 60_001n },
        { ...base, maxFeePerGas: 2_000_000_001n },
        { ...base, maxPriorityFeePerGas: 1_000_000_001n }
      ].map((call) => signEip1559(call, key).hash)
    )
    assert.strictEqual(hashes.size, 8)
  })

  it("the y parity is bit 0 of the recovery id (ids 2 and 3: R's x past the curve order)", () => {
    assert.deepStrictEqual([0, 1, 2, 3].map(yParityOf), [0, 1, 0, 1])
  })
})
