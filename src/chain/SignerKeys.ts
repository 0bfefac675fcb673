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
const N = secp256k1.CURVE.n

/**
 * A point's multiples for a windowed, non-constant-time wNAF multiplication: window w holds
 * 1..2^(W-1) times 2^(W·w)·P. Verification works on public data only (the signature, the hash, the
 * signer's public key), so nothing here needs noble's constant-time `multiply`, which adds a point in
 * every window of both halves of an endomorphism split and normalizes twice (about twice the additions
 * and three field inversions per check, where this takes one). noble 1.9.1's own `multiplyUnsafe` gives
 * wrong points for a point with a precomputed table, hence this.
 */
interface Table {
  readonly W: number
  readonly points: ReadonlyArray<CurvePoint>
}

const tableOf = (point: CurvePoint, W: number): Table => {
  const windows = Math.ceil(256 / W) + 1
  const size = 2 ** (W - 1)
  const points: Array<CurvePoint> = []
  let p = point
  for (let window = 0; window < windows; window++) {
    let multiple = p
    points.push(multiple)
    for (let i = 1; i < size; i++) {
      multiple = multiple.add(p)
      points.push(multiple)
    }
    p = multiple.double()
  }
  return { W, points }
}

/** acc + n·P, for 0 <= n < 2^256, from P's table (signed digits in (-2^(W-1), 2^(W-1)]). */
const addMultiple = (acc: CurvePoint, table: Table, n: bigint): CurvePoint => {
  const size = 2 ** (table.W - 1)
  const full = 2 ** table.W
  const mask = BigInt(full - 1)
  const shift = BigInt(table.W)
  let rest = n
  for (let window = 0; rest > 0n; window++) {
    let digit = Number(rest & mask)
    rest >>= shift
    if (digit > size) {
      digit -= full
      rest += 1n
    }
    if (digit !== 0) {
      const item = table.points[window * size + Math.abs(digit) - 1]!
      acc = acc.add(digit < 0 ? item.negate() : item)
    }
  }
  return acc
}

/** The generator's table (window 8, 4,224 points), made on the first check. */
let generatorTable: Table | undefined
const knownSigners = new Map<string, Table>()

const remember = (address: Address, publicKey: Hex) => {
  // Checked again here: the calls of a payer's first burst all recover (the check before the recovery
  // found no key) and each would build the same table, ~1,400 point additions apiece.
  if (knownSigners.has(address.toLowerCase())) return
  knownSigners.set(address.toLowerCase(), tableOf(secp256k1.ProjectivePoint.fromHex(publicKey.slice(2)), 6))
  if (knownSigners.size > KNOWN_SIGNERS) knownSigners.delete(knownSigners.keys().next().value!)
}

/** Whether recovering `signature` over `hash` gives `publicKey` (false also for any malformed input). */
const recoversTo = (publicKey: Table, hash: Hex, signature: Hex): boolean => {
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
  generatorTable ??= tableOf(secp256k1.ProjectivePoint.BASE, 8)
  const X = addMultiple(addMultiple(secp256k1.ProjectivePoint.ZERO, generatorTable, u1), publicKey, u2)
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
