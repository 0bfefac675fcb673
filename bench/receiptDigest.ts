/**
 * `npm run bench:receipt-digest`: the main-thread CPU of a receipt's EIP-712 digest and signature
 * (issue 12, signer), timed in process with `process.cpuUsage` over thousands of receipts.
 *
 * Two sets of receipts: `arbitrary` (the property tests' generator: every string field random, so
 * the kept hashes of repeating fields rarely hit) and `traffic` (a few providers and classes, a
 * request id and payment reference of the router's lengths, mostly no refund and no session; what the
 * router signs). Prints, per set: keccak calls and Keccak-f permutations per digest, µs per digest,
 * µs per signature (digest + libsecp256k1 signature, as `ReceiptSigner.signReceipt` does it); and the
 * µs of one keccak-256 by input length. Each figure is the best of `BENCH_ROUNDS` rounds. Asserts nothing.
 */
import { randomBytes, randomUUID } from "node:crypto"
import { keccak_256 } from "@noble/hashes/sha3"
import fc from "fast-check"
import { signDigestBytes } from "../src/chain/Secp256k1.ts"
import { keccak256Bytes, keccakEngine, keccakReady } from "../src/domain/Keccak.ts"
import type { ReceiptBody } from "../src/domain/Receipt.ts"
import { receiptDigest, receiptDigestBytes } from "../src/domain/ReceiptDigest.ts"
import { arbitraryReceipt } from "../test/support/Receipts.ts"

const RECEIPTS = Number(process.env.BENCH_RECEIPTS ?? 3_000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5)
const CHAIN_ID = 8453
const key = randomBytes(32)
const utf8 = new TextEncoder()

const arbitrary = fc.sample(arbitraryReceipt, { numRuns: RECEIPTS, seed: 12 })
const traffic: Array<ReceiptBody> = arbitrary.map((r, i) => ({
  ...r,
  request_id: randomUUID(),
  provider_id: `provider-${i % 4}`,
  model_class: ["chat-small", "chat-medium", "chat-large"][i % 3]!,
  price_in_cached: i % 2 === 0 ? null : 50_000,
  payment_ref: i % 3 === 0 ? `0x${randomBytes(32).toString("hex")}` : `credit:${randomUUID()}`,
  refund_ref: null,
  status: "ok",
  settlement: i % 3 === 0 ? "pending" : "landed",
  session_id: i % 10 === 0 ? `sess_${randomUUID()}` : null
}))

/** CPU µs per item of `run` over `items`, the best of `ROUNDS` rounds (a warm-up round first). */
const cpuPer = <A>(items: ReadonlyArray<A>, run: (a: A) => unknown): number => {
  let best = Number.POSITIVE_INFINITY
  for (let round = 0; round <= ROUNDS; round++) {
    const start = process.cpuUsage()
    for (const item of items) run(item)
    const used = process.cpuUsage(start)
    if (round > 0) best = Math.min(best, (used.user + used.system) / items.length)
  }
  return best
}

/** Keccak-f permutations of one keccak-256 over `length` bytes (rate 136). */
const permutations = (length: number) => Math.floor(length / 136) + 1
/**
 * The keccak calls (and their permutations) of one digest, counted from the digest's rules: request id
 * and payment reference, a refund reference or session when present, the struct hash (22 words, 704
 * bytes), the envelope (66 bytes); the repeating fields' hashes are kept after the first receipt.
 */
const hashed = (r: ReceiptBody) => {
  const strings = [r.request_id, r.payment_ref, r.refund_ref ?? "", r.session_id ?? ""]
    .filter((s, i) => i < 2 || s !== "")
    .map((s) => utf8.encode(s).length)
  return {
    calls: strings.length + 2,
    permutations: strings.reduce((n, len) => n + permutations(len), 0) + permutations(704) + permutations(66)
  }
}

const mean = (items: ReadonlyArray<ReceiptBody>, f: (r: ReceiptBody) => number) =>
  items.reduce((n, r) => n + f(r), 0) / items.length

const fixed = (n: number, digits = 2) => n.toFixed(digits)
await keccakReady
console.log(
  `receipts: ${RECEIPTS} per set, best of ${ROUNDS} rounds, CPU time (process.cpuUsage); keccak: ${keccakEngine()}`
)
console.log("set        keccak/digest  perms/digest  µs/digest  µs/digest(bytes)  µs/sign")
for (const [name, set] of [
  ["arbitrary", arbitrary],
  ["traffic", traffic]
] as const) {
  const digest = cpuPer(set, (r) => receiptDigest(r, CHAIN_ID))
  const digestBytes = cpuPer(set, (r) => receiptDigestBytes(r, CHAIN_ID))
  const sign = cpuPer(set, (r) =>
    signDigestBytes(Buffer.from(receiptDigest(r, CHAIN_ID).slice(2), "hex"), key)
  )
  console.log(
    `${name.padEnd(10)} ${fixed(mean(set, (r) => hashed(r).calls)).padStart(13)}  ${fixed(mean(set, (r) => hashed(r).permutations)).padStart(12)}  ${fixed(digest).padStart(9)}  ${fixed(digestBytes).padStart(16)}  ${fixed(sign).padStart(7)}`
  )
}

console.log("\nkeccak-256 of one input, µs (noble = @noble/hashes keccak_256; router = domain/Keccak.ts)")
console.log("bytes   noble  router")
for (const length of [32, 64, 66, 135, 200, 704]) {
  const inputs = Array.from({ length: 10_000 }, () => randomBytes(length))
  const noble = cpuPer(inputs, (b) => keccak_256(b))
  const router = cpuPer(inputs, (b) => keccak256Bytes(b))
  console.log(`${String(length).padStart(5)}  ${fixed(noble).padStart(6)}  ${fixed(router).padStart(6)}`)
}
