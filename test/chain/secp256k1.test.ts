import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Hex, hexToBytes, numberToHex, recoverPublicKey } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { vi } from "vitest"

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
const privateKey = fc.bigInt(1n, SECP256K1_N - 1n).map((d) => numberToHex(d, { size: 32 }))
const digest = fc
  .uint8Array({ minLength: 32, maxLength: 32 })
  .map((b) => `0x${Buffer.from(b).toString("hex")}` as Hex)

/** `Secp256k1.ts` as a process whose `SECP256K1_BACKEND` is `backend` loads it (the choice is made at load). */
const loadWith = async (backend: "native" | "wasm") => {
  const before = process.env.SECP256K1_BACKEND
  process.env.SECP256K1_BACKEND = backend
  vi.resetModules()
  try {
    return await import("../../src/chain/Secp256k1.ts")
  } finally {
    if (before === undefined) delete process.env.SECP256K1_BACKEND
    else process.env.SECP256K1_BACKEND = before
  }
}

// Both builds of libsecp256k1 give viem's bytes; on linux-x64 (CI, this machine) the native one must load,
// so a lost prebuilt binary fails here instead of silently costing 4x per recovery (D529).
describe.each(["native", "wasm"] as const)("secp256k1 (%s libsecp256k1)", (backend) => {
  it("is the build asked for", async () => {
    const module = await loadWith(backend)
    assert.strictEqual(module.secp256k1Backend, backend)
  })

  it("signs a digest byte for byte as viem's account.sign (RFC 6979, low s, v 27/28)", async () => {
    const { signDigestBytes } = await loadWith(backend)
    await fc.assert(
      fc.asyncProperty(privateKey, digest, async (key, hash) => {
        const expected = await privateKeyToAccount(key).sign({ hash })
        assert.strictEqual(signDigestBytes(hexToBytes(hash), hexToBytes(key)), expected)
      }),
      { numRuns: 300 }
    )
  })

  it("recovers the public key viem recovers, a high s included, and nothing from a malformed signature", async () => {
    const { recoverPublicKeyBytes } = await loadWith(backend)
    await fc.assert(
      fc.asyncProperty(privateKey, digest, fc.boolean(), async (key, hash, high) => {
        const low = await privateKeyToAccount(key).sign({ hash })
        // The high-s twin of a signature (s' = n - s, the recovery bit flipped) recovers the same key.
        const s = BigInt(`0x${low.slice(66, 130)}`)
        const signature = high
          ? (`${low.slice(0, 66)}${(SECP256K1_N - s).toString(16).padStart(64, "0")}${low.endsWith("1b") ? "1c" : "1b"}` as Hex)
          : low
        const recovered = recoverPublicKeyBytes(hash, signature)
        assert.isDefined(recovered)
        assert.strictEqual(
          `0x${Buffer.from(recovered!).toString("hex")}`,
          await recoverPublicKey({ hash, signature })
        )
      }),
      { numRuns: 100 }
    )
    const hash = `0x${"11".repeat(32)}`
    // r = 5 is no point's x on secp256k1 (5^3 + 7 = 132 is not a square mod p): nothing recovers.
    assert.isUndefined(recoverPublicKeyBytes(hash, `0x${"00".repeat(31)}05${"22".repeat(32)}1b`))
    assert.isUndefined(recoverPublicKeyBytes(hash, `0x${"00".repeat(64)}1b`))
    assert.isUndefined(recoverPublicKeyBytes(hash, `0x${"22".repeat(64)}1d`))
  })
})
