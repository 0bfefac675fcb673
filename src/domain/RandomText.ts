import { randomFillSync } from "node:crypto"

/**
 * Random identifiers and tokens drawn from a pool the CSPRNG fills 4 KB at a time (as Node's own
 * `randomUUID` does), instead of a `randomBytes` call per id: each call crossed into C++ and allocated
 * a buffer, twice on every paid request (its request id and its stream token; D321). The bytes are the
 * same CSPRNG's and each is handed out once.
 */
const POOL_BYTES = 4096
const pool = Buffer.allocUnsafe(POOL_BYTES)
let offset = POOL_BYTES

/** `bytes` fresh random bytes as text (`bytes` at most 4096). */
export const randomText = (bytes: number, encoding: "hex" | "base64url"): string => {
  if (offset + bytes > POOL_BYTES) {
    randomFillSync(pool)
    offset = 0
  }
  const text = pool.toString(encoding, offset, offset + bytes)
  offset += bytes
  return text
}
