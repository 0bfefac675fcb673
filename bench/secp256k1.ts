/**
 * `npm run bench:secp256k1`: libsecp256k1 native (the `secp256k1` package's prebuilt binding) against
 * the same library in WebAssembly (`tiny-secp256k1`), the two builds `chain/Secp256k1.ts` chooses
 * between: CPU µs of a recoverable signature (a receipt's, a transaction's) and of a public-key
 * recovery (an x402 signature check), in alternating rounds of one process, each figure the median of
 * `BENCH_ROUNDS` rounds over `BENCH_OPS` operations. Asserts nothing.
 */
import { createHash, randomBytes } from "node:crypto"
import { createRequire } from "node:module"
import * as wasm from "tiny-secp256k1"
import { secp256k1Backend } from "../src/chain/Secp256k1.ts"

const OPS = Number(process.env.BENCH_OPS ?? 2_000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 7)

interface Native {
  readonly ecdsaSign: (message: Uint8Array, key: Uint8Array) => { signature: Uint8Array; recid: number }
  readonly ecdsaRecover: (
    sig: Uint8Array,
    recid: number,
    message: Uint8Array,
    compressed: boolean
  ) => Uint8Array
}
const native = createRequire(import.meta.url)("secp256k1/bindings") as Native

const inputs = Array.from({ length: OPS }, (_, i) => {
  const key = randomBytes(32)
  const digest = createHash("sha256").update(`digest ${i}`).digest()
  const { signature, recoveryId } = wasm.signRecoverable(digest, key)
  return { key, digest, signature, recoveryId: recoveryId as 0 | 1 }
})

const builds = {
  native: {
    sign: (i: (typeof inputs)[number]) => native.ecdsaSign(i.digest, i.key),
    recover: (i: (typeof inputs)[number]) => native.ecdsaRecover(i.signature, i.recoveryId, i.digest, false)
  },
  wasm: {
    sign: (i: (typeof inputs)[number]) => wasm.signRecoverable(i.digest, i.key),
    recover: (i: (typeof inputs)[number]) => wasm.recover(i.digest, i.signature, i.recoveryId, false)
  }
}

const cpuPer = (run: (i: (typeof inputs)[number]) => unknown) => {
  const start = process.cpuUsage()
  for (const input of inputs) run(input)
  const used = process.cpuUsage(start)
  return (used.user + used.system) / inputs.length
}

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const figures = {
  native: { sign: [] as Array<number>, recover: [] as Array<number> },
  wasm: { sign: [] as Array<number>, recover: [] as Array<number> }
}
for (let round = 0; round <= ROUNDS; round++) {
  for (const name of round % 2 === 0 ? (["native", "wasm"] as const) : (["wasm", "native"] as const)) {
    const sign = cpuPer(builds[name].sign)
    const recover = cpuPer(builds[name].recover)
    if (round === 0) continue // warm-up
    figures[name].sign.push(sign)
    figures[name].recover.push(recover)
  }
}
const row = (name: "native" | "wasm") =>
  `${name.padEnd(8)} ${median(figures[name].sign).toFixed(1).padStart(10)} ${median(figures[name].recover).toFixed(1).padStart(12)}`
console.log(
  `secp256k1: ${OPS} operations a round, ${ROUNDS} rounds alternating, median CPU µs; the router uses: ${secp256k1Backend}`
)
console.log(`build    sign µs/op recover µs/op`)
console.log(row("native"))
console.log(row("wasm"))
console.log(
  `native / wasm: sign ${(median(figures.native.sign) / median(figures.wasm.sign)).toFixed(2)}, recover ${(median(figures.native.recover) / median(figures.wasm.recover)).toFixed(2)}`
)
