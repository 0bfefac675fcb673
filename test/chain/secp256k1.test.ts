import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Hex, hexToBytes, numberToHex, recoverPublicKey } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { recoverPublicKeyBytes, signDigestBytes } from "../../src/chain/Secp256k1.ts"

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
const privateKey = fc.bigInt(1n, SECP256K1_N - 1n).map((d) => numberToHex(d, { size: 32 }))
const digest = fc
  .uint8Array({ minLength: 32, maxLength: 32 })
  .map((b) => `0x${Buffer.from(b).toString("hex")}` as Hex)

describe("secp256k1 in WebAssembly", () => {
  it("signs a digest byte for byte as viem's account.sign (RFC 6979, low s, v 27/28)", async () => {
    await fc.assert(
      fc.asyncProperty(privateKey, digest, async (key, hash) => {
        const expected = await privateKeyToAccount(key).sign({ hash })
        assert.strictEqual(signDigestBytes(hexToBytes(hash), hexToBytes(key)), expected)
      }),
      { numRuns: 300 }
    )
  })

  it("recovers the public key viem recovers", async () => {
    await fc.assert(
      fc.asyncProperty(privateKey, digest, async (key, hash) => {
        const signature = await privateKeyToAccount(key).sign({ hash })
        const recovered = recoverPublicKeyBytes(hash, signature)
        assert.isDefined(recovered)
        assert.strictEqual(
          `0x${Buffer.from(recovered!).toString("hex")}`,
          await recoverPublicKey({ hash, signature })
        )
      }),
      { numRuns: 100 }
    )
  })
})
