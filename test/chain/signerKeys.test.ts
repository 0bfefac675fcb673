import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Address, type Hex, hexToBigInt, numberToHex, slice, verifyHash } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { signedBy } from "../../src/chain/SignerKeys.ts"

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
const word = (n: bigint) => numberToHex(n, { size: 32 }).slice(2)

const vOf = (signature: Hex) => Number(hexToBigInt(slice(signature, 64, 65)))
const withV = (signature: Hex, v: number): Hex =>
  `${slice(signature, 0, 64)}${v.toString(16).padStart(2, "0")}`
/** The high-s twin: same r, s -> n - s, recovery bit flipped (recovers the same signer). */
const twin = (signature: Hex): Hex =>
  `${slice(signature, 0, 32)}${word(SECP256K1_N - hexToBigInt(slice(signature, 32, 64)))}${(vOf(signature) === 27 ? 28 : 27).toString(16)}`
const withR = (signature: Hex, r: bigint): Hex => `0x${word(r)}${signature.slice(66)}`
const withS = (signature: Hex, s: bigint): Hex =>
  `0x${signature.slice(2, 66)}${word(s)}${signature.slice(130)}`
/** One byte of the signature (or of r, s or v) xored with a non-zero mask. */
const tampered = (signature: Hex, index: number, mask: number): Hex => {
  const bytes = Buffer.from(signature.slice(2), "hex")
  bytes[index % bytes.length]! ^= mask
  return `0x${bytes.toString("hex")}`
}

/** viem's answer, an error standing as "threw". */
const viemAnswer = (address: string, hash: Hex, signature: Hex) =>
  verifyHash({ address: address as Address, hash, signature }).then(
    (ok) => ok,
    () => "threw"
  )
const ourAnswer = (address: string, hash: Hex, signature: Hex) =>
  signedBy(address as Address, hash, signature).then(
    (ok) => ok,
    () => "threw"
  )

const privateKey = fc.bigInt(1n, SECP256K1_N - 1n).map((d) => `0x${word(d)}` as Hex)
const bytes32 = fc
  .uint8Array({ minLength: 32, maxLength: 32 })
  .map((b) => `0x${Buffer.from(b).toString("hex")}` as Hex)
const scalar = fc.bigInt(0n, 2n ** 256n - 1n)

describe("signedBy", () => {
  it("answers as viem's verifyHash on valid, forged, tampered, high-s and malformed signatures", async () => {
    let valid = 0
    await fc.assert(
      fc.asyncProperty(
        privateKey,
        privateKey,
        bytes32,
        bytes32,
        fc.nat(),
        fc.integer({ min: 1, max: 255 }),
        scalar,
        fc.integer({ min: 0, max: 255 }),
        async (key, otherKey, hash, otherHash, index, mask, randomScalar, randomV) => {
          const signer = privateKeyToAccount(key)
          const other = privateKeyToAccount(otherKey)
          const signature = await signer.sign({ hash })
          const forged = await other.sign({ hash })
          const cases: ReadonlyArray<[string, string, Hex, Hex]> = [
            ["valid", signer.address, hash, signature],
            ["valid, lowercase address", signer.address.toLowerCase(), hash, signature],
            ["valid, v as 0/1", signer.address, hash, withV(signature, vOf(signature) - 27)],
            ["high-s twin", signer.address, hash, twin(signature)],
            ["recovery bit flipped", signer.address, hash, withV(signature, vOf(signature) === 27 ? 28 : 27)],
            ["another signer's", signer.address, hash, forged],
            ["for another address", other.address, hash, signature],
            ["another hash", signer.address, otherHash, signature],
            ["one byte tampered", signer.address, hash, tampered(signature, index, mask)],
            ["any v", signer.address, hash, withV(signature, randomV)],
            ["random r", signer.address, hash, withR(signature, randomScalar)],
            ["random s", signer.address, hash, withS(signature, randomScalar)],
            ["r = 0", signer.address, hash, withR(signature, 0n)],
            ["s = 0", signer.address, hash, withS(signature, 0n)],
            ["r = n", signer.address, hash, withR(signature, SECP256K1_N)],
            ["s = n", signer.address, hash, withS(signature, SECP256K1_N)],
            ["truncated", signer.address, hash, signature.slice(0, 130) as Hex],
            ["one byte more", signer.address, hash, `${signature}00`],
            ["short hash", signer.address, slice(hash, 0, 31), signature],
            ["not an address", "0x1234", hash, signature]
          ]
          for (const [what, address, h, sig] of cases) {
            const expected = await viemAnswer(address, h, sig)
            if (expected === true) valid++
            assert.strictEqual(await ourAnswer(address, h, sig), expected, `${what}: ${address} ${h} ${sig}`)
          }
        }
      ),
      { numRuns: 60 }
    )
    // The valid cases were valid (four a run at least), so the comparison was not all refusals.
    assert.isAtLeast(valid, 4 * 60)
  })

  it("accepts the signer's own signature and refuses a flipped recovery bit (not only agreeing with viem)", async () => {
    const signer = privateKeyToAccount(`0x${word(12345678901234567890n)}`)
    const hash = `0x${"ab".repeat(32)}` as Hex
    const signature = await signer.sign({ hash })
    assert.isTrue(await signedBy(signer.address, hash, signature))
    assert.isTrue(await signedBy(signer.address, hash, twin(signature)))
    assert.isFalse(await signedBy(signer.address, hash, withV(signature, vOf(signature) === 27 ? 28 : 27)))
    assert.isFalse(await signedBy(signer.address, `0x${"cd".repeat(32)}`, signature))
  })
})
