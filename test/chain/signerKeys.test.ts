import { assert, describe, it } from "@effect/vitest"
import { type Hex, hexToBigInt, keccak256, numberToHex, slice, toHex, verifyHash } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { acceptedByKnownKey, isKnownSigner, signedBy } from "../../src/chain/SignerKeys.ts"

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n

/** The same signature with its recovery bit flipped (27 <-> 28). */
const flipped = (signature: Hex): Hex => {
  const v = Number(hexToBigInt(slice(signature, 64, 65)))
  return `${slice(signature, 0, 64)}${(v === 27 ? 28 : 27).toString(16)}`
}
/** The high-s twin: same r, s -> n - s, recovery bit flipped (recovers the same signer). */
const twin = (signature: Hex): Hex => {
  const s = hexToBigInt(slice(signature, 32, 64))
  const v = Number(hexToBigInt(slice(signature, 64, 65)))
  return `${slice(signature, 0, 32)}${numberToHex(SECP256K1_N - s, { size: 32 }).slice(2)}${(v === 27 ? 28 : 27).toString(16)}`
}
/** v as 0/1 instead of 27/28. */
const yParity = (signature: Hex): Hex => {
  const v = Number(hexToBigInt(slice(signature, 64, 65)))
  return `${slice(signature, 0, 64)}0${v - 27}`
}

describe("signedBy", () => {
  it("answers as viem's verifyHash does, for a signer seen before and one not", async () => {
    const signers = [privateKeyToAccount(generatePrivateKey()), privateKeyToAccount(generatePrivateKey())]
    const stranger = privateKeyToAccount(generatePrivateKey())
    let fast = 0
    for (let i = 0; i < 40; i++) {
      const signer = signers[i % 2]!
      const hash = keccak256(toHex(`call ${i}`))
      const signature = await signer.sign({ hash })
      const wasKnown = isKnownSigner(signer.address)
      if (wasKnown) {
        fast++
        // The kept key itself accepts what recovers to it (the call, its 0/1 form, its high-s twin, as
        // viem does; refusing high s is the verifier's rule) and not a flipped recovery bit.
        assert.isTrue(acceptedByKnownKey(signer.address, hash, signature))
        assert.isTrue(acceptedByKnownKey(signer.address, hash, yParity(signature)))
        assert.isTrue(acceptedByKnownKey(signer.address, hash, twin(signature)))
        assert.isFalse(acceptedByKnownKey(signer.address, hash, flipped(signature)))
        assert.isFalse(acceptedByKnownKey(signer.address, keccak256(toHex(`other ${i}`)), signature))
      }
      const otherHash = keccak256(toHex(`other ${i}`))
      const cases: ReadonlyArray<[string, Hex, Hex]> = [
        [signer.address, hash, signature],
        [signer.address, hash, yParity(signature)],
        [signer.address, hash, flipped(signature)],
        [signer.address, hash, twin(signature)],
        [signer.address, otherHash, signature],
        [stranger.address, hash, signature],
        [signer.address.toLowerCase(), hash, signature],
        [signer.address, hash, `${slice(signature, 0, 64)}1d`],
        [signer.address, hash, `0x${"00".repeat(64)}1b`],
        [signer.address, hash, `0x${"ff".repeat(64)}1b`]
      ]
      for (const [address, h, sig] of cases) {
        const expected = await verifyHash({ address: address as Hex, hash: h, signature: sig }).then(
          (ok) => ok,
          () => "threw"
        )
        const actual = await signedBy(address as Hex, h, sig).then(
          (ok) => ok,
          () => "threw"
        )
        assert.strictEqual(actual, expected, `${address} ${h} ${sig}`)
      }
      assert.isTrue(isKnownSigner(signer.address))
    }
    // All but each signer's first call were checked against the kept public key.
    assert.strictEqual(fast, 38)
    assert.isFalse(isKnownSigner(stranger.address))
  })
})
