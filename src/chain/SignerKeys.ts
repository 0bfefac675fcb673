import { invert } from "@noble/curves/abstract/modular"
import { secp256k1 } from "@noble/curves/secp256k1"
import { type Address, getAddress, type Hex, isAddressEqual, recoverPublicKey } from "viem"
import { publicKeyToAddress } from "viem/accounts"

/**
 * Whether `signature` over `hash` was made by `address`: the answer of viem's `verifyHash`
 * (recover the public key, compare addresses), cheaper for a signer seen before.
 *
 * Recovering a public key is a variable-base curve multiplication in pure JS (noble), 2.3–3.5 ms on
 * the shared machine and the largest CPU cost of an x402 call. A payer signs many calls, so the
 * public keys of the last `KNOWN_SIGNERS` signers that verified are kept with a small precomputed
 * table (window 6, about 300 KB each), and a signature of a known signer is checked by computing
 * X = (z/s)·G + (r/s)·Q: recovery with recovery bit v gives Q exactly when X is the point with x = r
 * and y of parity v (from s·R = z·G + r·Q), so the check accepts exactly what recovery to Q would.
 * Whatever it does not accept goes through viem's recovery as before, so an answer is always viem's.
 */
export const signedBy = async (address: Address, hash: Hex, signature: Hex): Promise<boolean> => {
  const known = knownSigners.get(address.toLowerCase())
  if (known !== undefined && recoversTo(known, hash, signature)) return true
  const expected = getAddress(address)
  const publicKey = await recoverPublicKey({ hash, signature })
  const matches = isAddressEqual(expected, publicKeyToAddress(publicKey))
  if (matches && known === undefined) remember(expected, publicKey)
  return matches
}

type CurvePoint = ReturnType<typeof secp256k1.ProjectivePoint.fromHex>

const KNOWN_SIGNERS = 32
const WINDOW = 6
const knownSigners = new Map<string, CurvePoint>()
const N = secp256k1.CURVE.n

const remember = (address: Address, publicKey: Hex) => {
  const point = secp256k1.utils.precompute(WINDOW, secp256k1.ProjectivePoint.fromHex(publicKey.slice(2)))
  knownSigners.set(address.toLowerCase(), point)
  if (knownSigners.size > KNOWN_SIGNERS) knownSigners.delete(knownSigners.keys().next().value!)
}

/** Whether recovering `signature` over `hash` gives `publicKey` (false also for any malformed input). */
const recoversTo = (publicKey: CurvePoint, hash: Hex, signature: Hex): boolean => {
  if (!/^0x[0-9a-fA-F]{130}$/.test(signature) || !/^0x[0-9a-fA-F]{64}$/.test(hash)) return false
  const v = Number.parseInt(signature.slice(130), 16)
  const parity = v === 0 || v === 27 ? 0n : v === 1 || v === 28 ? 1n : undefined
  if (parity === undefined) return false
  const r = BigInt(`0x${signature.slice(2, 66)}`)
  const s = BigInt(`0x${signature.slice(66, 130)}`)
  if (r < 1n || r >= N || s < 1n || s >= N) return false
  const sInverse = invert(s, N)
  const z = BigInt(hash) % N
  const u1 = (z * sInverse) % N
  const u2 = (r * sInverse) % N
  if (u1 === 0n || u2 === 0n) return false
  // \`multiply\`, not \`multiplyAndAddUnsafe\`: in noble 1.9.1 the unsafe path gives wrong points for a
  // point with its own precomputed table (test/chain/signerKeys.test.ts would catch it).
  const X = secp256k1.ProjectivePoint.BASE.multiply(u1).add(publicKey.multiply(u2))
  if (X.equals(secp256k1.ProjectivePoint.ZERO)) return false
  const { x, y } = X.toAffine()
  return x === r && (y & 1n) === parity
}

/** Whether `address` is among the signers kept (for tests). */
export const isKnownSigner = (address: Address) => knownSigners.has(address.toLowerCase())

/** Whether the kept public key of `address` accepts the signature without a recovery (for tests). */
export const acceptedByKnownKey = (address: Address, hash: Hex, signature: Hex) => {
  const known = knownSigners.get(address.toLowerCase())
  return known !== undefined && recoversTo(known, hash, signature)
}
