/**
 * `npm run bench:auction`: one auction over 1,000 live quotes (issue 12 item 4), timed in process.
 *
 * The book: 250 providers quoting each of the four chat classes (1,000 quotes) at prices spread around
 * the fleet's, with measured latencies recorded through the router's own `Latency` service, so the
 * auction reads a real latency lookup. Each profile (`auto`, `best`, `cheapest`, `fastest`) and a
 * latency SLO request are timed; the same-run baseline is the least any auction does: computing every
 * quote's worst case and sorting the book by it. The book is in quote id order with each quote's provider
 * number, as `QuoteBook.live` hands it (D282, D304); one line times the same auction over the book in
 * arrival order (the auction then sorts its exclusions). Prints CPU and wall time per auction; asserts
 * nothing.
 */
import { Effect, Schema } from "effect"
import { worstCase } from "../src/domain/Billing.ts"
import { SignedQuote } from "../src/domain/Quote.ts"
import { type AuctionRequest, type LiveQuote, runAuction } from "../src/market/Auction.ts"
import { defaultCatalog } from "../src/market/Catalog.ts"
import { Latency } from "../src/market/Latency.ts"
import { providerNumber } from "../src/market/ProviderNumbers.ts"
import { compareStrings } from "../src/market/Scoring.ts"

const PROVIDERS = Number(process.env.BENCH_PROVIDERS ?? 250)
const RUNS = Number(process.env.BENCH_RUNS ?? 2_000)
const CLASSES = [
  { id: "chat-small", priceIn: 100_000, priceOut: 400_000 },
  { id: "chat-medium", priceIn: 600_000, priceOut: 2_400_000 },
  { id: "chat-large", priceIn: 2_500_000, priceOut: 12_000_000 },
  { id: "reasoning-large", priceIn: 4_000_000, priceOut: 16_000_000 }
]

// A deterministic spread (no randomness: two runs time the same book).
const spread = (i: number, base: number) => base - Math.floor(base / 10) + ((i * 7919) % Math.floor(base / 5))

const nowMs = Date.now()
const nowS = Math.floor(nowMs / 1000)
const arrival: ReadonlyArray<LiveQuote> = Array.from({ length: PROVIDERS }, (_, p) =>
  CLASSES.map((c, k) => ({
    quote: Schema.decodeUnknownSync(SignedQuote)({
      quote_id: `q-${p}-${c.id}`,
      provider_id: `provider-${String(p).padStart(4, "0")}`,
      model_class: c.id,
      price_in: spread(p + k, c.priceIn),
      price_out: spread(p * 3 + k, c.priceOut),
      max_context: 128_000,
      valid_until: nowS + 30,
      capacity_rps: 64,
      sig: `0x${"ab".repeat(65)}`
    }),
    inFlight: p % 5,
    // The provider's number, as the quote book hands it.
    provider: providerNumber(`provider-${String(p).padStart(4, "0")}`)
  }))
).flat()
/** The book as the router's quote book hands it: in quote id order. */
const quotes = [...arrival].sort((a, b) => compareStrings(a.quote.quote_id, b.quote.quote_id))

/** The router's Latency service, fed 40 observations per (provider, class) (a fifth left cold). */
const lookup = Effect.runSync(
  Effect.gen(function* () {
    const latency = yield* Latency
    for (const { quote } of quotes) {
      const p = Number(quote.provider_id.slice(-4))
      if (p % 5 === 0) continue
      for (let i = 0; i < 40; i++)
        yield* latency.observe(quote.provider_id, quote.model_class, 150 + ((p * 37 + i * 11) % 900))
    }
    return yield* latency.lookup
  }).pipe(Effect.provide(Latency.layer))
)

const request = (overrides: Partial<AuctionRequest>): AuctionRequest => ({
  requested: "auto",
  promptTokens: 2_000,
  maxTokens: 1_000,
  nowMs,
  ...overrides
})

/**
 * Batches of BATCH runs; per batch the wall time and this process's CPU time (`process.cpuUsage`), each
 * divided by BATCH. CPU time is what a busy machine does not inflate: wall time also counts the time
 * the thread waited for a core.
 */
const BATCH = 20
const time = (run: () => unknown) => {
  for (let i = 0; i < Math.min(200, RUNS); i++) run()
  const wall: Array<number> = []
  const cpu: Array<number> = []
  for (let b = 0; b < Math.max(1, Math.floor(RUNS / BATCH)); b++) {
    const cpuBefore = process.cpuUsage()
    const started = performance.now()
    for (let i = 0; i < BATCH; i++) run()
    wall.push((performance.now() - started) / BATCH)
    const used = process.cpuUsage(cpuBefore)
    cpu.push((used.user + used.system) / 1000 / BATCH)
  }
  const median = (xs: Array<number>) => xs.sort((x, y) => x - y)[Math.floor(xs.length / 2)]!
  return { cpu: median(cpu), wall: median(wall) }
}

const cases: ReadonlyArray<[string, () => unknown]> = [
  [
    "baseline: worst case of every quote, sorted",
    () => quotes.map((l) => ({ l, cost: worstCase(2_000, 1_000, l.quote) })).sort((a, b) => a.cost - b.cost)
  ],
  ["auction, auto", () => runAuction(request({}), quotes, defaultCatalog, lookup)],
  ["auction, best", () => runAuction(request({ requested: "best" }), quotes, defaultCatalog, lookup)],
  ["auction, cheapest", () => runAuction(request({ requested: "cheapest" }), quotes, defaultCatalog, lookup)],
  ["auction, fastest", () => runAuction(request({ requested: "fastest" }), quotes, defaultCatalog, lookup)],
  [
    "auction, auto with a 1.5 s SLO",
    () =>
      runAuction(
        request({ latencySlo: { deadlineMs: 1_500, confidence: 0.9 } }),
        quotes,
        defaultCatalog,
        lookup
      )
  ],
  ["auction, auto, book in arrival order", () => runAuction(request({}), arrival, defaultCatalog, lookup)],
  [
    "auction, one class pinned (250 quotes)",
    () => runAuction(request({ requested: "chat-medium" }), quotes, defaultCatalog, lookup)
  ]
]

process.stdout.write(
  `one auction over ${quotes.length} live quotes, ${RUNS} runs each in batches of ${BATCH}: median of the batches' mean\n` +
    `  ${"".padEnd(44)} ${"cpu".padStart(8)}    ${"wall".padStart(8)}    ${"x baseline (cpu)".padStart(16)}\n`
)
let baseline = Number.NaN
for (const [name, run] of cases) {
  const { cpu, wall } = time(run)
  if (Number.isNaN(baseline)) baseline = cpu
  process.stdout.write(
    `  ${name.padEnd(44)} ${cpu.toFixed(3).padStart(8)} ms ${wall.toFixed(3).padStart(8)} ms ${(cpu / baseline).toFixed(1).padStart(16)}\n`
  )
}
