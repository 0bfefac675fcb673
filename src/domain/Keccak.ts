/**
 * keccak-256 for the hashes on the router's hot paths (a receipt's EIP-712 digest, an x402
 * authorization's digest and signer address): hash-wasm's WebAssembly Keccak (MIT), about 1 µs for an
 * input of one block (up to 135 bytes) and 4 µs for a receipt's 704-byte struct, where noble's pure-JS
 * `keccak_256` (the one viem uses) takes 11-12 µs and 66 µs on this machine (`npm run
 * bench:receipt-digest`, D480). Node's OpenSSL has no KECCAK-256 (`createHash` refuses it).
 *
 * hash-wasm instantiates its module asynchronously; its hasher is synchronous after that. The module
 * starts it when loaded, and until it is ready (the first turns of the event loop) hashes with noble,
 * so every call is answered, and with the same bytes. One hasher serves every call: each call is one
 * synchronous `init`, `update`, `digest`, so no two calls interleave. Imports neither viem nor effect.
 */
import { keccak_256 } from "@noble/hashes/sha3"
import { createKeccak, type IHasher } from "hash-wasm"

let hasher: IHasher | undefined

/**
 * Settles once the WebAssembly hasher is in use (or, should instantiating it fail, never does: noble
 * goes on hashing). Tests await it; the router need not.
 */
export const keccakReady: Promise<void> = createKeccak(256).then(
  (instance) => {
    hasher = instance
  },
  () => new Promise<void>(() => {})
)

/** Which implementation answers now (a test checks the WebAssembly one is reached). */
export const keccakEngine = (): "wasm" | "noble" => (hasher === undefined ? "noble" : "wasm")

/** keccak-256 of `bytes`: 32 bytes, the same as noble's `keccak_256` and viem's `keccak256`. */
export const keccak256Bytes = (bytes: Uint8Array): Uint8Array =>
  hasher === undefined ? keccak_256(bytes) : hasher.init().update(bytes).digest("binary")
