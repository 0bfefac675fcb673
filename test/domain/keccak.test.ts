import { assert, describe, it } from "@effect/vitest"
import { keccak_256 } from "@noble/hashes/sha3"
import fc from "fast-check"
import { keccak256 } from "viem"
import { keccak256Bytes, keccakEngine, keccakReady } from "../../src/domain/Keccak.ts"

const hex = (bytes: Uint8Array) => `0x${Buffer.from(bytes).toString("hex")}`

describe("keccak256Bytes", () => {
  it("is viem's keccak256 for any input, across block boundaries (136 bytes) too, once in WebAssembly", async () => {
    await keccakReady
    assert.strictEqual(keccakEngine(), "wasm")
    const lengths = fc.oneof(
      fc.integer({ min: 0, max: 800 }),
      fc.constantFrom(0, 1, 31, 32, 33, 64, 66, 134, 135, 136, 137, 271, 272, 273, 704)
    )
    fc.assert(
      fc.property(
        lengths.chain((n) => fc.uint8Array({ minLength: n, maxLength: n })),
        (bytes) => {
          const digest = keccak256Bytes(bytes)
          assert.strictEqual(digest.length, 32)
          assert.strictEqual(hex(digest), keccak256(bytes))
          assert.strictEqual(hex(digest), hex(keccak_256(bytes)))
        }
      ),
      { numRuns: 500 }
    )
  })

  it("gives each call its own bytes: a kept digest is not overwritten by the next call", async () => {
    await keccakReady
    const first = keccak256Bytes(new Uint8Array([1]))
    const kept = hex(first)
    keccak256Bytes(new Uint8Array([2]))
    assert.strictEqual(hex(first), kept)
  })
})
