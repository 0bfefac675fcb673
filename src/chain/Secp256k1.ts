/**
 * secp256k1 signing and public-key recovery through libsecp256k1: natively (the `secp256k1` package's
 * prebuilt N-API binding of libsecp256k1, loaded without any install script or compiler) where its
 * binary loads, else the same library compiled to WebAssembly (`tiny-secp256k1`). Both give the same
 * bytes (RFC 6979 nonces, low s): the router signer's signatures (receipts, `Chain.signDigest`,
 * transactions) and the recovery behind x402 signature checks (`SignerKeys.ts`). Measured (D529): a
 * recovery 117-145 µs native against 536-681 µs in WebAssembly, a signature 80-99 µs against 265-274 µs;
 * viem's pure-JS noble took 2.9-3.8 ms and 0.56-1.2 ms (D430). Imports neither viem nor effect.
 */
import { createRequire } from "node:module"
import * as wasm from "tiny-secp256k1"

/** What the router needs of libsecp256k1: a recoverable signature and a recovery. */
interface Backend {
  readonly name: "native" | "wasm"
  /** 64 bytes `r ‖ s` (low s) and the recovery id, for a 32-byte digest. Throws on a key outside [1, n). */
  readonly sign: (digest: Uint8Array, key: Uint8Array) => { signature: Uint8Array; recoveryId: number }
  /** The uncompressed key (65 bytes), `undefined` when the signature recovers none. */
  readonly recover: (digest: Uint8Array, compact: Uint8Array, recoveryId: 0 | 1) => Uint8Array | undefined
}

/** The `secp256k1` package's binding (`secp256k1/bindings`): throws on a failure instead of answering null. */
interface NativeSecp256k1 {
  readonly ecdsaSign: (message: Uint8Array, key: Uint8Array) => { signature: Uint8Array; recid: number }
  readonly ecdsaRecover: (
    signature: Uint8Array,
    recid: number,
    message: Uint8Array,
    compressed: boolean
  ) => Uint8Array
}

const wasmBackend: Backend = {
  name: "wasm",
  sign: (digest, key) => wasm.signRecoverable(digest, key),
  recover: (digest, compact, recoveryId) => {
    // tiny-secp256k1 throws (`Expected Signature`) on an r that is no point's x instead of answering null.
    try {
      return wasm.recover(digest, compact, recoveryId, false) ?? undefined
    } catch {
      return undefined
    }
  }
}

const nativeBackend = (binding: NativeSecp256k1): Backend => ({
  name: "native",
  sign: (digest, key) => {
    const { signature, recid } = binding.ecdsaSign(digest, key)
    return { signature, recoveryId: recid }
  },
  recover: (digest, compact, recoveryId) => {
    try {
      return binding.ecdsaRecover(compact, recoveryId, digest, false)
    } catch {
      return undefined
    }
  }
})

/**
 * The native binding when its prebuilt binary loads here (`SECP256K1_BACKEND=wasm` forces WebAssembly),
 * else WebAssembly. `secp256k1/bindings`, not the package's entry: the entry falls back to a pure-JS
 * implementation (`elliptic`) when the binary does not load, which would be slower than either.
 */
const chooseBackend = (): Backend => {
  if (process.env.SECP256K1_BACKEND === "wasm") return wasmBackend
  try {
    return nativeBackend(createRequire(import.meta.url)("secp256k1/bindings") as NativeSecp256k1)
  } catch {
    return wasmBackend
  }
}

const backend = chooseBackend()

/** Which libsecp256k1 build this process signs and recovers with (logged at start, printed by the benches). */
export const secp256k1Backend: Backend["name"] = backend.name

/** The recoverable signature of a 32-byte `digest` by `key`: `r ‖ s` (low s) and the recovery id. */
export const signRecoverable = (digest: Uint8Array, key: Uint8Array) => backend.sign(digest, key)

/**
 * The signature of a 32-byte `digest` by `key`, serialized as viem's `account.sign` serializes it:
 * `r ‖ s ‖ v`, v 27 for recovery id 0, else 28. libsecp256k1's RFC 6979 nonce (no extra entropy) and
 * low-s normalization give noble's bytes, so the signature is viem's byte for byte
 * (test/chain/secp256k1.test.ts).
 */
export const signDigestBytes = (digest: Uint8Array, key: Uint8Array): `0x${string}` => {
  const { signature, recoveryId } = backend.sign(digest, key)
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
  return backend.recover(Buffer.from(hash.slice(2), "hex"), compact, recoveryId)
}
