/**
 * secp256k1 signing and public-key recovery through libsecp256k1 compiled to WebAssembly
 * (`tiny-secp256k1`): the router signer's signatures (receipts, `Chain.signDigest`) and the recovery
 * behind x402 signature checks (`SignerKeys.ts`). About 0.17 ms a signature and 0.35-0.43 ms a
 * recovery on this machine, against noble's (pure JavaScript, what viem uses) 0.56-1.2 ms and 2.9-3.8 ms
 * (D430). Imports neither viem nor effect.
 */
import { recover, signRecoverable } from "tiny-secp256k1"

/**
 * The signature of a 32-byte `digest` by `key`, serialized as viem's `account.sign` serializes it:
 * `r ‖ s ‖ v`, v 27 for recovery id 0, else 28. libsecp256k1's RFC 6979 nonce (no extra entropy) and
 * low-s normalization give noble's bytes, so the signature is viem's byte for byte
 * (test/chain/secp256k1.test.ts).
 */
export const signDigestBytes = (digest: Uint8Array, key: Uint8Array): `0x${string}` => {
  const { signature, recoveryId } = signRecoverable(digest, key)
  return `0x${Buffer.from(signature).toString("hex")}${recoveryId === 0 ? "1b" : "1c"}`
}

const N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
const HASH = /^0x[0-9a-fA-F]{64}$/
const SIGNATURE = /^0x[0-9a-fA-F]{130}$/

/**
 * The uncompressed public key (65 bytes) that recovering `signature` over `hash` gives, as viem's
 * `recoverPublicKey` would; `undefined` for any input whose answer is not a key (a malformed hash or
 * signature, a recovery byte other than 0, 1, 27 or 28, r or s out of range, an r that is no point's x):
 * viem's own answer for those (mostly an error) is for the caller to ask. A high s recovers as viem
 * does (to the key its low-s twin with the other recovery bit recovers to): refusing it is a rule of
 * the caller's.
 */
export const recoverPublicKeyBytes = (hash: string, signature: string): Uint8Array | undefined => {
  if (!HASH.test(hash) || !SIGNATURE.test(signature)) return undefined
  const v = Number.parseInt(signature.slice(130), 16)
  const recoveryId = v === 0 || v === 27 ? 0 : v === 1 || v === 28 ? 1 : undefined
  if (recoveryId === undefined) return undefined
  const r = BigInt(`0x${signature.slice(2, 66)}`)
  const s = BigInt(`0x${signature.slice(66, 130)}`)
  if (r === 0n || r >= N || s === 0n || s >= N) return undefined
  const compact = Buffer.from(signature.slice(2, 130), "hex")
  return recover(Buffer.from(hash.slice(2), "hex"), compact, recoveryId, false) ?? undefined
}
