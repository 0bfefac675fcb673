import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import fc from "fast-check"
import { charge, worstCase } from "../../src/domain/Billing.ts"
import { SignedQuote } from "../../src/domain/Quote.ts"
import {
  type AuctionCleared,
  type AuctionOutcome,
  type AuctionRequest,
  anonymizeBids,
  clearingTariff,
  criticalCost,
  type LatencyLookup,
  type LiveQuote,
  PROFILES,
  rivalCounterfactuals,
  runAuction
} from "../../src/market/Auction.ts"
import {
  CAPABILITIES,
  type Catalog,
  defaultCatalog,
  findClass,
  missingCapabilities
} from "../../src/market/Catalog.ts"
import {
  emptyLatencyState,
  type LatencyState,
  latencyEstimate,
  type Maturity,
  record
} from "../../src/market/LatencyStats.ts"
import { compareStrings } from "../../src/market/Scoring.ts"
import { qualityShift, type TaskEvidence, type TaskFit, taskFitOf } from "../../src/market/TaskFit.ts"
import { referenceAuction } from "./support/referenceAuction.ts"

const NOW_S = 1_750_000_000
const NOW_MS = NOW_S * 1000
const SIG = `0x${"ab".repeat(65)}`

interface QuoteFields {
  readonly quote_id: string
  readonly provider_id: string
  readonly model_class: string
  readonly price_in: number
  readonly price_out: number
  readonly max_context?: number
  readonly valid_until?: number
  readonly capacity_rps?: number
  readonly price_in_cached?: number | undefined
}

const makeQuote = ({ price_in_cached, ...fields }: QuoteFields): SignedQuote =>
  Schema.decodeUnknownSync(SignedQuote)({
    max_context: 128_000,
    valid_until: NOW_S + 30,
    capacity_rps: 4,
    sig: SIG,
    ...fields,
    ...(price_in_cached === undefined ? {} : { price_in_cached, session_ttl_s: 300 })
  })

const live = (fields: QuoteFields, inFlight = 0): LiveQuote => ({ quote: makeQuote(fields), inFlight })

const fixedLatency =
  (ms: Readonly<Record<string, number>>, maturity: Maturity = "mature"): LatencyLookup =>
  (providerId) => ({ quantile: () => ms[providerId] ?? 2_000, maturity })

const request = (overrides: Partial<AuctionRequest>): AuctionRequest => ({
  requested: "cheapest",
  promptTokens: 2_000,
  maxTokens: 1_000,
  nowMs: NOW_MS,
  ...overrides
})

const cleared = (outcome: AuctionOutcome): AuctionCleared => {
  if (outcome._tag !== "Cleared") throw new Error(`expected a cleared auction, got ${outcome.reason}`)
  return outcome
}

// The worked example of docs/auction.md
const exampleBook: ReadonlyArray<LiveQuote> = [
  live({
    quote_id: "q-a",
    provider_id: "alpha",
    model_class: "chat-large",
    price_in: 2_500_000,
    price_out: 12_000_000
  }),
  live({
    quote_id: "q-b",
    provider_id: "beta",
    model_class: "chat-large",
    price_in: 2_800_000,
    price_out: 12_500_000
  }),
  live({
    quote_id: "q-c",
    provider_id: "gamma",
    model_class: "chat-large",
    price_in: 2_000_000,
    price_out: 14_000_000
  })
]
const exampleLatency = fixedLatency({ alpha: 2_000, beta: 400, gamma: 900 })

describe("Auction: the worked example of docs/auction.md", () => {
  it("cheapest: the winner is paid the runner-up's cost, exactly", () => {
    const r = cleared(runAuction(request({}), exampleBook, defaultCatalog, exampleLatency))
    assert.deepStrictEqual(
      r.bids.map((b) => [b.rank, b.quote_id, b.score_breakdown.cost, b.outcome]),
      [
        [1, "q-a", 17_000, "won"],
        [2, "q-c", 18_000, "lost"],
        [3, "q-b", 18_100, "lost"]
      ]
    )
    assert.strictEqual(r.version, "second-score/1")
    assert.strictEqual(r.priceSetter, "runner-up")
    assert.strictEqual(r.ownCost, 17_000)
    assert.strictEqual(r.reserveCost, 21_000)
    assert.deepStrictEqual(r.clear, { price_in: 2_647_058, price_out: 12_705_884 })
    assert.strictEqual(r.clearedCost, 18_000)
    assert.strictEqual(r.premium, 1_000)
    assert.strictEqual(r.premiumCapBps, 10_000)
    const metered = { input: 2_000, cachedInput: 0, output: 400 }
    assert.strictEqual(charge(metered, r.clear), 10_377)
    assert.deepStrictEqual(
      rivalCounterfactuals(r.bids, metered).map((c) => [c.label, c.rank, c.charge]),
      [
        ["rival-1", 2, 9_600],
        ["rival-2", 3, 10_600]
      ]
    )
  })

  it("auto: scores are cost x multiplier; the winner clears at the runner-up's critical cost", () => {
    const r = cleared(runAuction(request({ requested: "auto" }), exampleBook, defaultCatalog, exampleLatency))
    assert.deepStrictEqual(
      r.bids.map((b) => [b.quote_id, b.score_breakdown.multiplier_bps, b.score]),
      [
        ["q-a", 10_516, 17_877.2],
        ["q-b", 10_208, 18_476.48],
        ["q-c", 10_363, 18_653.4]
      ]
    )
    assert.strictEqual(r.priceSetter, "runner-up")
    assert.strictEqual(r.clearedCost, 17_569)
    assert.strictEqual(worstCase(2_000, 1_000, r.clear), 17_569)
    assert.strictEqual(r.premiumCapBps, 11_500)
  })

  it("a thin market clears at the phantom reserve; without a reserve at the own bid", () => {
    const alone = [exampleBook[0] as LiveQuote]
    const r = cleared(runAuction(request({}), alone, defaultCatalog, exampleLatency))
    assert.strictEqual(r.priceSetter, "phantom-reserve")
    assert.strictEqual(r.clearedCost, 21_000)
    const noReserve: Catalog = defaultCatalog.map(({ reserve: _reserve, ...c }) => c)
    const own = cleared(runAuction(request({}), alone, noReserve, exampleLatency))
    assert.strictEqual(own.priceSetter, "own-bid")
    assert.deepStrictEqual(own.clear, { price_in: 2_500_000, price_out: 12_000_000 })
    assert.strictEqual(own.premium, 0)
  })

  it("with an SLO, auto clears the cheapest feasible provider (deadline-price/1)", () => {
    const slo = { deadlineMs: 1_000, confidence: 0.9 }
    const r = cleared(
      runAuction(request({ requested: "auto", latencySlo: slo }), exampleBook, defaultCatalog, exampleLatency)
    )
    assert.strictEqual(r.version, "deadline-price/1")
    assert.deepStrictEqual(
      r.bids.map((b) => b.quote_id),
      ["q-c", "q-b"]
    )
    assert.deepStrictEqual(r.excluded, [{ quote_id: "q-a", reason: "latency_slo" }])
    assert.strictEqual(r.clearedCost, 18_100)
    assert.strictEqual(r.priceSetter, "runner-up")
  })

  it("the reserve binds when the runner-up asks more than it", () => {
    const book = [
      exampleBook[0] as LiveQuote,
      live({
        quote_id: "q-z",
        provider_id: "zeta",
        model_class: "chat-large",
        price_in: 3_000_000,
        price_out: 15_000_000
      })
    ]
    const lowReserve: Catalog = defaultCatalog.map((c) =>
      c.id === "chat-large" ? { ...c, reserve: { price_in: 2_900_000, price_out: 14_000_000 } } : c
    )
    const r = cleared(runAuction(request({}), book, lowReserve, exampleLatency))
    assert.strictEqual(r.priceSetter, "phantom-reserve")
    assert.strictEqual(r.clearedCost, 5_800 + 14_000)
  })
})

describe("Auction rules", () => {
  it("a session lock wins at the locked tariff", () => {
    const lock = {
      providerId: "beta",
      modelClass: "chat-large",
      tariff: { price_in: 2_700_000, price_out: 12_000_000, price_in_cached: 300_000 }
    }
    const r = cleared(
      runAuction(
        request({ requested: "auto", sessionLock: lock }),
        exampleBook,
        defaultCatalog,
        exampleLatency
      )
    )
    assert.strictEqual(r.winner.provider_id, "beta")
    assert.strictEqual(r.priceSetter, "session-lock")
    assert.deepStrictEqual(r.clear, { price_in: 2_700_000, price_out: 12_000_000, price_in_cached: 300_000 })
    assert.strictEqual(r.clearedCost, 5_400 + 12_000)
    const gone = runAuction(
      request({ sessionLock: { ...lock, providerId: "omega" } }),
      exampleBook,
      defaultCatalog,
      exampleLatency
    )
    assert.strictEqual(gone._tag === "NoEligibleQuote" && gone.reason, "session_lock_unavailable")
  })

  it("auto with a latency SLO picks the cheapest feasible class, then its cheapest provider (deadline-price/1)", () => {
    const book = [
      ...exampleBook,
      live({
        quote_id: "s-1",
        provider_id: "delta",
        model_class: "chat-small",
        price_in: 200_000,
        price_out: 800_000
      }),
      live({
        quote_id: "s-2",
        provider_id: "eps",
        model_class: "chat-small",
        price_in: 100_000,
        price_out: 400_000
      }),
      live({
        quote_id: "s-3",
        provider_id: "zeta",
        model_class: "chat-small",
        price_in: 250_000,
        price_out: 1_000_000
      })
    ]
    const latency = fixedLatency({ alpha: 2_000, beta: 400, gamma: 900, delta: 300, eps: 3_000, zeta: 350 })
    const slo = { deadlineMs: 1_000, confidence: 0.9 }
    const r = cleared(
      runAuction(request({ requested: "auto", latencySlo: slo }), book, defaultCatalog, latency)
    )
    assert.strictEqual(r.version, "deadline-price/1")
    assert.strictEqual(r.winner.quote_id, "s-1")
    assert.deepStrictEqual(
      r.bids.map((b) => b.quote_id),
      ["s-1", "s-3"]
    )
    assert.strictEqual(r.clearedCost, worstCase(2_000, 1_000, { price_in: 250_000, price_out: 1_000_000 }))
    const reasons = Object.fromEntries(r.excluded.map((e) => [e.quote_id, e.reason]))
    assert.deepStrictEqual(reasons, {
      "q-a": "latency_slo",
      "q-b": "class_not_selected",
      "q-c": "class_not_selected",
      "s-2": "latency_slo"
    })
    const without = cleared(runAuction(request({ requested: "auto" }), book, defaultCatalog, latency))
    assert.strictEqual(without.version, "second-score/1")
    const tight = runAuction(
      request({ requested: "auto", latencySlo: { deadlineMs: 100, confidence: 0.9 } }),
      book,
      defaultCatalog,
      latency
    )
    assert.strictEqual(tight._tag === "NoEligibleQuote" && tight.reason, "latency_slo_infeasible")
  })

  it("best keeps the top quality band; minQuality and capabilities filter classes", () => {
    const book = [
      ...exampleBook,
      live({
        quote_id: "r-1",
        provider_id: "rho",
        model_class: "reasoning-large",
        price_in: 5_000_000,
        price_out: 20_000_000
      }),
      live({
        quote_id: "m-1",
        provider_id: "mu",
        model_class: "chat-medium",
        price_in: 500_000,
        price_out: 2_000_000
      })
    ]
    const best = cleared(runAuction(request({ requested: "best" }), book, defaultCatalog, exampleLatency))
    assert.sameMembers(
      best.bids.map((b) => b.model_class),
      ["reasoning-large", "chat-large", "chat-large", "chat-large"]
    )
    const vision = cleared(
      runAuction(
        request({ requested: "cheapest", requiredCapabilities: ["vision"], minQuality: 0.8 }),
        book,
        defaultCatalog,
        exampleLatency
      )
    )
    assert.isTrue(vision.bids.every((b) => b.model_class === "chat-large"))
    const unmet = runAuction(
      request({ requested: "auto", minQuality: 0.99 }),
      book,
      defaultCatalog,
      exampleLatency
    )
    assert.strictEqual(unmet._tag === "NoEligibleQuote" && unmet.reason, "requirements_unmet")
    const unknown = runAuction(request({ requested: "gpt-17" }), book, defaultCatalog, exampleLatency)
    assert.strictEqual(unknown._tag === "NoEligibleQuote" && unknown.reason, "unknown_model_class")
    const empty = runAuction(request({ requested: "chat-small" }), book, defaultCatalog, exampleLatency)
    assert.strictEqual(empty._tag === "NoEligibleQuote" && empty.reason, "no_quotes")
  })

  it("a provider never sets its own price", () => {
    const book = [
      ...exampleBook,
      live({
        quote_id: "q-a2",
        provider_id: "alpha",
        model_class: "chat-large",
        price_in: 2_600_000,
        price_out: 12_000_000
      })
    ]
    const r = cleared(runAuction(request({}), book, defaultCatalog, exampleLatency))
    assert.strictEqual(r.clearedCost, 18_000)
    assert.deepInclude(r.excluded, { quote_id: "q-a2", reason: "provider_better_quote" })
  })

  it("anonymizeBids labels losers rival-<n> by rank and keeps their tariffs", () => {
    const r = anonymizeBids(cleared(runAuction(request({}), exampleBook, defaultCatalog, exampleLatency)))
    assert.deepStrictEqual(
      r.bids.map((b) => [b.provider_id, b.quote_id, b.price_in, b.price_out]),
      [
        ["alpha", "q-a", 2_500_000, 12_000_000],
        ["rival-1", "rival-1", 2_000_000, 14_000_000],
        ["rival-2", "rival-2", 2_800_000, 12_500_000]
      ]
    )
  })

  it("rejects token counts outside [1, 1e6]", () => {
    assert.throws(
      () => runAuction(request({ maxTokens: 0 }), exampleBook, defaultCatalog, exampleLatency),
      RangeError
    )
    assert.throws(
      () => runAuction(request({ promptTokens: 1_000_001 }), exampleBook, defaultCatalog, exampleLatency),
      RangeError
    )
  })
})

// ---- property tests over random books ----

const CLASS_IDS = defaultCatalog.map((c) => c.id)
const PROVIDERS = ["p0", "p1", "p2", "p3", "p4"]

const catalogArb: fc.Arbitrary<Catalog> = fc
  .array(fc.boolean(), { minLength: defaultCatalog.length, maxLength: defaultCatalog.length })
  .map((keep) => defaultCatalog.map(({ reserve, ...c }, i) => (keep[i] && reserve ? { ...c, reserve } : c)))

const permille = fc.oneof(fc.constantFrom(500, 800, 1_000), fc.integer({ min: 0, max: 1_150 }))
const quoteArb = fc.record({
  provider: fc.integer({ min: 0, max: PROVIDERS.length - 1 }),
  modelClass: fc.oneof(
    { weight: 12, arbitrary: fc.constantFrom(...CLASS_IDS) },
    { weight: 1, arbitrary: fc.constant("mystery") }
  ),
  inPermille: permille,
  outPermille: permille,
  maxContext: fc.constantFrom(8_000, 32_000, 128_000, 200_000),
  ttlS: fc.oneof(
    { weight: 6, arbitrary: fc.integer({ min: 1, max: 30 }) },
    { weight: 1, arbitrary: fc.integer({ min: -5, max: 0 }) }
  ),
  capacity: fc.integer({ min: 1, max: 4 }),
  inFlight: fc.oneof(
    { weight: 6, arbitrary: fc.constant(0) },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: 4 }) }
  ),
  cached: fc.option(fc.integer({ min: 0, max: 100_000 }), { nil: undefined })
})
const scaled = (price: number, scale: number) => (Number.isSafeInteger(price * scale) ? price * scale : price)
/**
 * A generated row as a live quote: its prices its class's reserve (or a stand-in for a class the catalog
 * does not know) times its permilles, then times `scale` where that stays a safe integer.
 */
const liveFromRow = (
  row: typeof quoteArb extends fc.Arbitrary<infer R> ? R : never,
  quoteId: string,
  providerId: string,
  scale = 1
): LiveQuote => {
  const reserve = findClass(defaultCatalog, row.modelClass)?.reserve ?? {
    price_in: 1_000_000,
    price_out: 4_000_000
  }
  return live(
    {
      quote_id: quoteId,
      provider_id: providerId,
      model_class: row.modelClass,
      price_in: scaled(Math.floor((reserve.price_in * row.inPermille) / 1_000), scale),
      price_out: scaled(Math.floor((reserve.price_out * row.outPermille) / 1_000), scale),
      max_context: row.maxContext,
      valid_until: NOW_S + row.ttlS,
      capacity_rps: row.capacity,
      price_in_cached: row.cached
    },
    row.inFlight
  )
}
const bookArb = fc
  .array(quoteArb, { maxLength: 12 })
  .map((rows) =>
    rows.map((row, i) => liveFromRow(row, `q-${String(i).padStart(2, "0")}`, PROVIDERS[row.provider] ?? "p0"))
  )
const latencyArb = fc
  .array(fc.integer({ min: 50, max: 4_000 }), { minLength: PROVIDERS.length, maxLength: PROVIDERS.length })
  .map(
    (ms): LatencyLookup =>
      (providerId, classId) => {
        const base = (ms[PROVIDERS.indexOf(providerId)] ?? 2_000) + classId.length
        return { quantile: (q) => base * (0.5 + q), maturity: base > 1_000 ? "warming" : "mature" }
      }
  )
const tokensArb = fc.oneof(
  { weight: 8, arbitrary: fc.integer({ min: 1, max: 8_000 }) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 1_000_000 }) }
)
const sometimes = <T>(arbitrary: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> =>
  fc.oneof({ weight: 2, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary })
/** Rating evidence for a task: some classes rated (any count, any mean on 1..5), some not. */
const taskFitArb: fc.Arbitrary<TaskFit> = fc
  .array(
    fc.option(
      fc.record({
        ratings: fc.integer({ min: 0, max: 80 }),
        mean: fc.double({ min: 1, max: 5, noNaN: true })
      }),
      { nil: undefined }
    ),
    { minLength: CLASS_IDS.length, maxLength: CLASS_IDS.length }
  )
  .map((rows) => {
    const byClass = new Map<string, TaskEvidence>()
    rows.forEach((row, i) => {
      if (row !== undefined) byClass.set(CLASS_IDS[i]!, row)
    })
    return taskFitOf("some-task", byClass)
  })
const requestArb: fc.Arbitrary<AuctionRequest> = fc.record({
  requested: fc.oneof(
    { weight: 3, arbitrary: fc.constantFrom("auto", "best", "cheapest", "fastest") },
    { weight: 1, arbitrary: fc.constantFrom(...CLASS_IDS) }
  ),
  promptTokens: tokensArb,
  maxTokens: tokensArb,
  minQuality: sometimes(fc.double({ min: 0, max: 1, noNaN: true })),
  requiredCapabilities: sometimes(fc.subarray([...CAPABILITIES], { maxLength: 2 })),
  latencySlo: sometimes(
    fc.record({
      deadlineMs: fc.integer({ min: 100, max: 5_000 }),
      confidence: fc.double({ min: 0.5, max: 0.99, noNaN: true })
    })
  ),
  sessionLock: fc.constant(undefined),
  taskFit: sometimes(taskFitArb),
  nowMs: fc.constant(NOW_MS)
})

const ownCostOf = (r: AuctionCleared): number =>
  worstCase(r.scoringTokens.promptTokens, r.scoringTokens.maxTokens, r.winningQuote)

describe("Auction properties (random books)", () => {
  it("the cleared tariff is never below the own ask, and charges exactly the cleared cost", () => {
    fc.assert(
      fc.property(requestArb, bookArb, catalogArb, latencyArb, (req, book, catalog, latency) => {
        const r = runAuction(req, book, catalog, latency)
        if (r._tag !== "Cleared") return
        assert.isAtLeast(r.clear.price_in, r.winningQuote.price_in)
        assert.isAtLeast(r.clear.price_out, r.winningQuote.price_out)
        assert.isTrue(Number.isSafeInteger(r.clear.price_in) && Number.isSafeInteger(r.clear.price_out))
        assert.strictEqual(worstCase(req.promptTokens, req.maxTokens, r.clear), r.clearedCost)
        assert.strictEqual(r.ownCost, ownCostOf(r))
        assert.strictEqual(r.premium, r.clearedCost - r.ownCost)
        assert.isAtLeast(r.premium, 0)
        if (r.reserveCost !== null) assert.isAtMost(r.clearedCost, r.reserveCost)
      }),
      { numRuns: 500 }
    )
  })

  it("cheapest with two or more bids pays exactly the runner-up's cost unless the reserve binds", () => {
    fc.assert(
      fc.property(requestArb, bookArb, catalogArb, latencyArb, (req, book, catalog, latency) => {
        const r = runAuction({ ...req, requested: "cheapest" }, book, catalog, latency)
        if (r._tag !== "Cleared" || r.bids.length < 2) return
        const runnerUpCost = r.bids[1]?.score_breakdown.cost ?? Number.NaN
        if (r.reserveCost !== null && r.reserveCost < runnerUpCost) {
          assert.strictEqual(r.priceSetter, "phantom-reserve")
          assert.strictEqual(r.clearedCost, r.reserveCost)
        } else {
          assert.strictEqual(r.priceSetter, "runner-up")
          assert.strictEqual(r.clearedCost, runnerUpCost)
        }
      }),
      { numRuns: 500 }
    )
  })

  it("the reported price setter is the one that bound", () => {
    fc.assert(
      fc.property(requestArb, bookArb, catalogArb, latencyArb, (req, book, catalog, latency) => {
        const r = runAuction(req, book, catalog, latency)
        if (r._tag !== "Cleared") return
        const [winner, runnerUp] = r.bids
        const critical =
          winner && runnerUp
            ? criticalCost(
                winner.score_breakdown.multiplier_bps,
                BigInt(runnerUp.score_breakdown.cost) * BigInt(runnerUp.score_breakdown.multiplier_bps)
              )
            : undefined
        switch (r.priceSetter) {
          case "runner-up":
            assert.strictEqual(r.clearedCost, critical)
            if (r.reserveCost !== null) assert.isAtMost(r.clearedCost, r.reserveCost)
            break
          case "phantom-reserve":
            assert.strictEqual(r.clearedCost, r.reserveCost)
            if (critical !== undefined) assert.isBelow(r.reserveCost ?? Number.NaN, critical)
            break
          case "own-bid":
            assert.strictEqual(r.bids.length, 1)
            assert.strictEqual(r.reserveCost, null)
            assert.strictEqual(r.clearedCost, r.ownCost)
            break
          case "session-lock":
            assert.fail("no session lock was asked")
        }
      }),
      { numRuns: 500 }
    )
  })

  it("one eligible quote clears at the phantom reserve or its own bid, never above the reserve", () => {
    fc.assert(
      fc.property(requestArb, bookArb, catalogArb, latencyArb, (req, book, catalog, latency) => {
        const r = runAuction(req, book, catalog, latency)
        if (r._tag !== "Cleared" || r.bids.length !== 1) return
        if (r.reserveCost === null) {
          assert.strictEqual(r.priceSetter, "own-bid")
          assert.strictEqual(r.clearedCost, r.ownCost)
        } else {
          assert.strictEqual(r.priceSetter, "phantom-reserve")
          assert.strictEqual(r.clearedCost, r.reserveCost)
        }
      }),
      { numRuns: 500 }
    )
  })

  it("ties break deterministically: shuffling the book changes nothing", () => {
    const tiedBook = bookArb.map((book) => [
      ...book,
      ...book.map((l) =>
        live(
          { ...l.quote, quote_id: `${l.quote.quote_id}-twin`, provider_id: `${l.quote.provider_id}-twin` },
          l.inFlight
        )
      )
    ])
    fc.assert(
      fc.property(
        requestArb,
        tiedBook,
        catalogArb,
        latencyArb,
        fc.infiniteStream(fc.nat()),
        (req, book, catalog, latency, keys) => {
          const iterator = keys[Symbol.iterator]()
          const shuffled = book
            .map((l) => ({ l, k: iterator.next().value ?? 0 }))
            .sort((a, b) => a.k - b.k)
            .map((x) => x.l)
          assert.deepStrictEqual(
            runAuction(req, shuffled, catalog, latency),
            runAuction(req, book, catalog, latency)
          )
        }
      ),
      { numRuns: 300 }
    )
  })

  it("no ineligible quote ever wins, bids come from distinct providers, and the SLO is honoured", () => {
    fc.assert(
      fc.property(requestArb, bookArb, catalogArb, latencyArb, (req, book, catalog, latency) => {
        const r = runAuction(req, book, catalog, latency)
        if (r._tag !== "Cleared") return
        const q = r.winningQuote
        const modelClass = findClass(catalog, q.model_class)
        assert.isDefined(modelClass)
        if (modelClass === undefined) return
        const inFlight = book.find((l) => l.quote === q)?.inFlight ?? Number.NaN
        assert.isAbove(q.valid_until * 1000, req.nowMs)
        assert.isBelow(inFlight, q.capacity_rps)
        assert.isAtLeast(Math.min(q.max_context, modelClass.max_context), req.promptTokens + req.maxTokens)
        if (modelClass.reserve)
          assert.isAtMost(r.ownCost, worstCase(req.promptTokens, req.maxTokens, modelClass.reserve))
        if (!["auto", "best", "cheapest", "fastest"].includes(req.requested))
          assert.strictEqual(q.model_class, req.requested)
        if (req.minQuality !== undefined) assert.isAtLeast(modelClass.quality, req.minQuality)
        assert.lengthOf(missingCapabilities(modelClass, req.requiredCapabilities ?? []), 0)
        assert.strictEqual(new Set(r.bids.map((b) => b.provider_id)).size, r.bids.length)
        assert.strictEqual(r.eligible, r.bids.length)
        assert.strictEqual(r.considered, r.bids.length + r.excluded.length)
        const slo = req.latencySlo
        if (slo !== undefined) {
          for (const bid of r.bids) {
            assert.isAtMost(
              latency(bid.provider_id, bid.model_class).quantile(slo.confidence),
              slo.deadlineMs
            )
          }
          if (req.requested === "auto") {
            assert.strictEqual(r.version, "deadline-price/1")
            assert.strictEqual(r.ownCost, Math.min(...r.bids.map((b) => b.score_breakdown.cost)))
          }
        }
      }),
      { numRuns: 500 }
    )
  })

  it("the winner pays at most the profile's premium cap over the cheapest independent alternative", () => {
    fc.assert(
      fc.property(requestArb, bookArb, catalogArb, latencyArb, (req, book, catalog, latency) => {
        const r = runAuction(req, book, catalog, latency)
        if (r._tag !== "Cleared") return
        assert.strictEqual(r.premiumCapBps, PROFILES[r.profile].premiumCapBps)
        const cheapestAlternative = Math.min(...r.bids.slice(1).map((b) => b.score_breakdown.cost))
        if (r.bids.length < 2) return
        assert.isAtMost(r.clearedCost * 10_000, r.premiumCapBps * cheapestAlternative)
      }),
      { numRuns: 500 }
    )
  })

  it("a session lock is honoured whenever the locked provider has a live quote in the class", () => {
    fc.assert(
      fc.property(requestArb, bookArb, latencyArb, fc.nat(), (req, book, latency, pick) => {
        const target = book[pick % Math.max(1, book.length)]
        if (target === undefined || findClass(defaultCatalog, target.quote.model_class) === undefined) return
        const tariff = { price_in: 1_234_567, price_out: 2_345_678 }
        const sessionLock = {
          providerId: target.quote.provider_id,
          modelClass: target.quote.model_class,
          tariff
        }
        const r = runAuction({ ...req, sessionLock }, book, defaultCatalog, latency)
        const available = book.some(
          (l) =>
            l.quote.provider_id === sessionLock.providerId &&
            l.quote.model_class === sessionLock.modelClass &&
            l.quote.valid_until * 1000 > req.nowMs &&
            l.inFlight < l.quote.capacity_rps &&
            l.quote.max_context >= req.promptTokens + req.maxTokens &&
            (findClass(defaultCatalog, l.quote.model_class)?.max_context ?? 0) >=
              req.promptTokens + req.maxTokens
        )
        if (!available) {
          assert.strictEqual(r._tag === "NoEligibleQuote" && r.reason, "session_lock_unavailable")
          return
        }
        const c = cleared(r)
        assert.strictEqual(c.winner.provider_id, sessionLock.providerId)
        assert.strictEqual(c.priceSetter, "session-lock")
        assert.deepStrictEqual(c.clear, tariff)
        assert.strictEqual(c.clearedCost, worstCase(req.promptTokens, req.maxTokens, tariff))
      }),
      { numRuns: 300 }
    )
  })
})

/** What an auction decided, without the score breakdowns' task annotations. */
const decided = (r: AuctionOutcome) =>
  r._tag === "Cleared"
    ? {
        winner: r.winner.quote_id,
        clear: r.clear,
        priceSetter: r.priceSetter,
        bids: r.bids.map((b) => [b.quote_id, b.score, b.score_breakdown.multiplier_bps] as const),
        excluded: r.excluded
      }
    : { reason: r.reason, excluded: r.excluded }

describe("Auction properties with a task's ratings (D232)", () => {
  it("the ratings act exactly as the moved class qualities would: the same second-score auction over another catalog", () => {
    fc.assert(
      fc.property(
        requestArb,
        bookArb,
        catalogArb,
        latencyArb,
        taskFitArb,
        (req, book, catalog, latency, taskFit) => {
          // `min_quality` reads the published quality, so it is left out of the comparison.
          const base = { ...req, minQuality: undefined, taskFit: undefined }
          const moved = catalog.map((c) => ({
            ...c,
            quality: Math.round((c.quality + qualityShift(c.quality, taskFit.evidence(c.id))) * 1e6) / 1e6
          }))
          const withTask = runAuction({ ...base, taskFit }, book, catalog, latency)
          assert.deepStrictEqual(decided(withTask), decided(runAuction(base, book, moved, latency)))
          if (withTask._tag !== "Cleared") return
          for (const bid of withTask.bids) {
            const fit = bid.score_breakdown.task_fit!
            assert.strictEqual(fit.task, "some-task")
            assert.isAtMost(Math.abs(fit.quality_shift), 0.25)
            if (fit.ratings < 5) assert.strictEqual(fit.quality_shift, 0)
          }
        }
      ),
      { numRuns: 500 }
    )
  })

  it("better ratings for the winner's class never make that class lose, and never change a `cheapest` auction", () => {
    fc.assert(
      fc.property(
        requestArb,
        bookArb,
        catalogArb,
        latencyArb,
        taskFitArb,
        fc.integer({ min: 5, max: 200 }),
        (req, book, catalog, latency, taskFit, ratings) => {
          const request = { ...req, sessionLock: undefined, taskFit }
          const r = runAuction(request, book, catalog, latency)
          if (r._tag !== "Cleared") return
          const winnerClass = r.winner.model_class
          // Better evidence: the top mean from at least as many ratings as the class had (fewer top
          // ratings than before would move it less than the evidence it replaces).
          const praised = (modelClass: string) =>
            modelClass === winnerClass
              ? { ratings: Math.max(ratings, taskFit.evidence(modelClass)?.ratings ?? 0), mean: 5 }
              : taskFit.evidence(modelClass)
          const again = runAuction(
            { ...request, taskFit: { task: taskFit.task, evidence: praised } },
            book,
            catalog,
            latency
          )
          assert.strictEqual(again._tag, "Cleared")
          // Its class still wins. Which of the class's bids wins may change: the shift lowers every
          // bid's quality penalty alike, but a bid whose penalties already reach the premium cap keeps
          // its multiplier while a rival's falls, so price and latency weigh differently within the class.
          if (again._tag === "Cleared") assert.strictEqual(again.winner.model_class, winnerClass)
          if (r.profile === "cheapest") {
            assert.deepStrictEqual(
              decided(runAuction({ ...request, taskFit: undefined }, book, catalog, latency)),
              decided(r)
            )
          }
        }
      ),
      { numRuns: 500 }
    )
  })
})

describe("clearingTariff", () => {
  it("lands exactly on any target at or above the own cost, component-wise at or above the own tariff", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 1_000_000 }),
        fc.integer({ min: 1, max: 1_000_000 }),
        fc.integer({ min: 0, max: 50_000_000 }),
        fc.integer({ min: 0, max: 50_000_000 }),
        fc.integer({ min: 0, max: 10_000_000 }),
        (promptTokens, maxTokens, priceIn, priceOut, extra) => {
          const own = { price_in: priceIn, price_out: priceOut }
          const target = worstCase(promptTokens, maxTokens, own) + extra
          const clear = clearingTariff(own, { promptTokens, maxTokens }, target)
          assert.strictEqual(worstCase(promptTokens, maxTokens, clear), target)
          assert.isAtLeast(clear.price_in, priceIn)
          assert.isAtLeast(clear.price_out, priceOut)
          assert.isTrue(Number.isSafeInteger(clear.price_in) && Number.isSafeInteger(clear.price_out))
        }
      ),
      { numRuns: 2_000 }
    )
  })

  it("never throws for huge targets over tiny own costs: safe prices, exact where a safe tariff carries it (D425)", () => {
    const MAX = Number.MAX_SAFE_INTEGER
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 1_000_000 }),
        fc.integer({ min: 1, max: 1_000_000 }),
        fc.integer({ min: 0, max: 5_000_000_000_000 }),
        fc.integer({ min: 0, max: 5_000_000_000_000 }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (promptTokens, maxTokens, priceIn, priceOut, where) => {
          const own = { price_in: priceIn, price_out: priceOut }
          const ownCost = worstCase(promptTokens, maxTokens, own)
          const target = ownCost + Math.floor((MAX - ownCost) * where)
          const clear = clearingTariff(own, { promptTokens, maxTokens }, target)
          assert.isTrue(Number.isSafeInteger(clear.price_in) && Number.isSafeInteger(clear.price_out))
          assert.isAtLeast(clear.price_in, priceIn)
          assert.isAtLeast(clear.price_out, priceOut)
          const cleared = worstCase(promptTokens, maxTokens, clear)
          assert.isAtMost(cleared, target)
          // Both components capped at 2^53 - 1 carry (prompt + max) * (2^53 - 1) of numerator: below that
          // (with a bucket's room for the own prices' part), the charge is the target exactly.
          const capacity = (BigInt(promptTokens) + BigInt(maxTokens)) * BigInt(MAX)
          const room = 2n * 1_000_000n * BigInt(Math.max(promptTokens, maxTokens))
          if (BigInt(target) * 1_000_000n + room <= capacity) assert.strictEqual(cleared, target)
          else assert.strictEqual(clear.price_in === MAX || clear.price_out === MAX, true)
        }
      ),
      { numRuns: 2_000 }
    )
  })

  it("refuses a target below the own cost", () => {
    assert.throws(
      () => clearingTariff({ price_in: 1_000_000, price_out: 0 }, { promptTokens: 10, maxTokens: 1 }, 9),
      RangeError
    )
  })
})

// ---- the optimized auction against the reference it replaced (D280, D281) ----

const MANY_PROVIDERS = Array.from({ length: 24 }, (_, i) => `prov-${i}`)
/** Larger books: many providers, several quotes each, ties on price, and prices wide enough for bigint scores. */
const wideBookArb = fc
  .tuple(
    fc.array(
      fc.record({
        row: quoteArb,
        provider: fc.integer({ min: 0, max: MANY_PROVIDERS.length - 1 }),
        id: fc.integer({ min: 0, max: 400 })
      }),
      { maxLength: 60, size: "max" }
    ),
    fc.constantFrom(1, 1, 1, 10_000, 1_000_000)
  )
  .map(([rows, scale]) =>
    rows.map(({ row, provider, id }, i) => liveFromRow(row, `q-${id}-${i}`, MANY_PROVIDERS[provider]!, scale))
  )
/** Latency from the router's own statistics: measured, warming and never-measured pairs. */
const measuredLatencyArb = fc
  .array(fc.array(fc.integer({ min: 20, max: 12_000 }), { maxLength: 30, size: "max" }), {
    minLength: MANY_PROVIDERS.length,
    maxLength: MANY_PROVIDERS.length
  })
  .map((samples): LatencyLookup => {
    const states = new Map<string, LatencyState>()
    MANY_PROVIDERS.forEach((provider, p) => {
      let state = emptyLatencyState
      for (const [k, ms] of (samples[p] ?? []).entries()) state = record(state, ms, NOW_MS - 60_000 * k)
      states.set(provider, state)
    })
    return (providerId) => latencyEstimate(states.get(providerId), NOW_MS)
  })

describe("the optimized auction decides exactly as the reference it replaced", () => {
  const same = (r: AuctionOutcome, expected: AuctionOutcome) => {
    assert.deepStrictEqual(r, expected)
    // Key order too: bids and breakdowns are served and stored as JSON.
    assert.strictEqual(JSON.stringify(r), JSON.stringify(expected))
  }
  const lockOf = (book: ReadonlyArray<LiveQuote>, pick: number | undefined) => {
    const target = pick === undefined ? undefined : book[pick % Math.max(1, book.length)]
    return target === undefined
      ? undefined
      : {
          providerId: target.quote.provider_id,
          modelClass: target.quote.model_class,
          tariff: { price_in: 1_234_567, price_out: 2_345_678, price_in_cached: 600_000 }
        }
  }

  /**
   * Provider numbers as the quote book hands them (`LiveQuote.provider`): dense from 0 in order of first
   * sight, sparse (large and spread out: the auction numbers the providers itself), on some quotes only,
   * or none. The reference ignores them.
   */
  const numbered = (
    book: ReadonlyArray<LiveQuote>,
    numbering: "none" | "dense" | "sparse" | "partial"
  ): ReadonlyArray<LiveQuote> => {
    if (numbering === "none") return book
    const numbers = new Map<string, number>()
    return book.map((live, i) => {
      if (numbering === "partial" && i % 3 === 1) return live
      const id = live.quote.provider_id
      if (!numbers.has(id))
        numbers.set(id, numbering === "sparse" ? 1_000 + 997 * numbers.size : numbers.size)
      return { ...live, provider: numbers.get(id) }
    })
  }

  /** Any book in arrival order or in quote id order (as the quote book hands it), with or without a lock. */
  const matchesReference = (
    books: fc.Arbitrary<ReadonlyArray<LiveQuote>>,
    latencies: fc.Arbitrary<LatencyLookup>,
    numRuns: number
  ) =>
    fc.assert(
      fc.property(
        requestArb,
        books,
        catalogArb,
        latencies,
        sometimes(fc.nat()),
        fc.boolean(),
        fc.constantFrom("none", "dense", "sparse", "partial" as const),
        (req, book, catalog, latency, pick, sorted, numbering) => {
          const ordered = sorted
            ? [...book].sort((a, b) => compareStrings(a.quote.quote_id, b.quote.quote_id))
            : book
          const request = { ...req, sessionLock: lockOf(book, pick) }
          same(
            runAuction(request, numbered(ordered, numbering), catalog, latency),
            referenceAuction(request, ordered, catalog, latency)
          )
        }
      ),
      { numRuns }
    )

  it("on small random books, in any order, with and without a session lock", () => {
    matchesReference(bookArb, latencyArb, 1_000)
  })

  it("on larger books of many providers, with measured latencies and scores beyond 2^53", () => {
    matchesReference(wideBookArb, measuredLatencyArb, 500)
  })

  it("an auction run inside another's latency lookup, or after one that threw, decides as the reference", () => {
    // Auctions share their buffers from one to the next (D302): neither may see the other's.
    fc.assert(
      fc.property(requestArb, wideBookArb, bookArb, measuredLatencyArb, (req, outer, inner, latency) => {
        const request = { ...req, sessionLock: undefined }
        const nested: Array<[AuctionOutcome, AuctionOutcome]> = []
        const reentrant: LatencyLookup = (providerId, classId) => {
          if (nested.length < 2)
            nested.push([
              runAuction(request, inner, defaultCatalog, latency),
              referenceAuction(request, inner, defaultCatalog, latency)
            ])
          return latency(providerId, classId)
        }
        same(
          runAuction(request, outer, defaultCatalog, reentrant),
          referenceAuction(request, outer, defaultCatalog, latency)
        )
        for (const [got, expected] of nested) same(got, expected)
        const failing: LatencyLookup = () => {
          throw new Error("lookup failed")
        }
        let threw = false
        try {
          runAuction(request, outer, defaultCatalog, failing)
        } catch (e) {
          threw = (e as Error).message === "lookup failed"
        }
        // The lookup is asked only for a quote that passed every other filter.
        assert.strictEqual(threw, nested.length > 0)
        same(
          runAuction(request, inner, defaultCatalog, latency),
          referenceAuction(request, inner, defaultCatalog, latency)
        )
      }),
      { numRuns: 200 }
    )
  })
})
