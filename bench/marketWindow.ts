/**
 * `npm run bench:market-window`: what the market data window (`src/marketdata/Window.ts`) keeps and costs for a
 * day of clears, beside a baseline in the same run: the same clears held raw with each class's TTFTs in a sorted
 * array (what the window did before D549). For `BENCH_CLEARS` (default 100,000, 500,000 and 2,000,000) clears
 * spread over 24 h in five classes and ten providers, each in a fresh process state (a full collection between):
 * heap after a full collection, per clear, and microseconds an add over the last 100,000 adds. Asserts nothing.
 * Needs `--expose-gc` (the script passes it to itself).
 */
import { execFileSync } from "node:child_process"
import type { ClearRecord } from "../src/marketdata/Series.ts"
import { ClearWindow } from "../src/marketdata/Window.ts"

const DAY = 86_400_000
const HOUR = 3_600_000
const CLASSES = ["chat-small", "chat-medium", "chat-large", "code", "reasoning"]

/** A clear as a notification brings it: its strings parsed anew, as `JSON.parse` makes them. */
const clearAt = (i: number, at: number): ClearRecord =>
  JSON.parse(
    JSON.stringify({
      id: i + 1,
      requestId: `req_${((i * 2654435761) >>> 0).toString(16).padStart(24, "0")}`,
      at,
      modelClass: CLASSES[i % 5],
      provider: `prov-${i % 10}`,
      profile: "balanced",
      priceIn: 100_000,
      priceOut: 400_000,
      tokensIn: 12,
      tokensOut: 6,
      tokensCached: 0,
      chargeNum: 3_600_000,
      charged: 4,
      ttftMs: 40 + ((i * 7919) % 2_000),
      priceSetter: "runner-up",
      quotesCompeting: 2
    })
  ) as ClearRecord

/** The baseline: every clear held, sorted by time, and each class's TTFTs spliced into a sorted array. */
class RawDay {
  readonly clears: Array<ClearRecord> = []
  readonly ids = new Set<number>()
  readonly ttfts = new Map<string, Array<number>>()
  add(c: ClearRecord) {
    if (this.ids.has(c.id)) return
    this.ids.add(c.id)
    this.clears.push(c)
    const ttfts = this.ttfts.get(c.modelClass) ?? []
    this.ttfts.set(c.modelClass, ttfts)
    let lo = 0
    let hi = ttfts.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (ttfts[mid]! < c.ttftMs) lo = mid + 1
      else hi = mid
    }
    ttfts.splice(lo, 0, c.ttftMs)
  }
}

const gc = () => (globalThis as { gc?: () => void }).gc?.()

const run = (kind: string, n: number) => {
  const now = Date.now()
  const start = now - DAY + 60_000
  gc()
  const before = process.memoryUsage().heapUsed
  const window = new ClearWindow(DAY, DAY + HOUR, HOUR + 60_000)
  window.roll(now)
  const raw = new RawDay()
  const add = kind === "window" ? (c: ClearRecord) => window.add(c) : (c: ClearRecord) => raw.add(c)
  let lastStart = 0
  for (let i = 0; i < n; i++) {
    if (i === n - 100_000) lastStart = performance.now()
    add(clearAt(i, start + Math.floor((i / n) * (DAY - 120_000))))
  }
  const perAdd = ((performance.now() - lastStart) * 1000) / Math.min(n, 100_000)
  gc()
  const heap = process.memoryUsage().heapUsed - before
  // Kept alive to the reading above.
  if (window.version < 0 || raw.clears.length < 0) console.log("")
  return { heap, perAdd }
}

const child = process.argv[2]
if (child !== undefined) {
  const [kind, n] = child.split(":")
  const { heap, perAdd } = run(kind!, Number(n))
  process.stdout.write(JSON.stringify({ heap, perAdd }))
} else {
  const counts = (process.env.BENCH_CLEARS ?? "100000,500000,2000000").split(",").map(Number)
  console.log("A day of clears in the market window (D549, D551) beside every clear held raw (before)\n")
  console.log("clears      raw: heap MB  B/clear  µs/add    window: heap MB  B/clear  µs/add")
  for (const n of counts) {
    const measure = (kind: string) =>
      JSON.parse(
        execFileSync(
          process.execPath,
          ["--expose-gc", "--import", "tsx", import.meta.filename, `${kind}:${n}`],
          {
            encoding: "utf8",
            maxBuffer: 1 << 20
          }
        )
      ) as { heap: number; perAdd: number }
    const raw = measure("raw")
    const win = measure("window")
    const row = (m: { heap: number; perAdd: number }) =>
      `${(m.heap / 2 ** 20).toFixed(1).padStart(12)}  ${(m.heap / n).toFixed(0).padStart(7)}  ${m.perAdd.toFixed(2).padStart(6)}`
    console.log(`${String(n).padEnd(10)}${row(raw)}    ${row(win)}`)
  }
}
