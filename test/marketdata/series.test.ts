import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import { chargeNumerator } from "../../src/domain/Billing.ts"
import {
  blendedPrice,
  byTime,
  type ClearRecord,
  candles,
  classStats,
  compositeIndex,
  type Grid,
  hhi,
  resolveGrid,
  SERIES_BOUNDS
} from "../../src/marketdata/Series.ts"

let nextId = 1
const clear = (
  at: number,
  modelClass: string,
  tokens: { input: number; output: number; cached?: number },
  tariff: { price_in: number; price_out: number },
  ttftMs = 100,
  provider = "p1"
): ClearRecord => {
  const counts = { input: tokens.input, cachedInput: tokens.cached ?? 0, output: tokens.output }
  const num = Number(chargeNumerator(counts, tariff))
  return {
    id: nextId++,
    requestId: `r${nextId}`,
    at,
    modelClass,
    provider,
    profile: "balanced",
    priceIn: tariff.price_in,
    priceOut: tariff.price_out,
    tokensIn: tokens.input,
    tokensOut: tokens.output,
    tokensCached: tokens.cached ?? 0,
    chargeNum: num,
    charged: Math.ceil(num / 1_000_000),
    ttftMs,
    priceSetter: "runner_up",
    quotesCompeting: 2
  }
}

const grid: Grid = { windowMs: 3_000, bucketMs: 1_000, from: 0, to: 3_000, points: 3 }

// Hand-computed: A trades twice in bucket 0, not in bucket 1, once in bucket 2; B once in bucket 1.
const a1 = clear(100, "A", { input: 1_000, output: 0 }, { price_in: 2_000_000, price_out: 0 }, 100)
const a2 = clear(500, "A", { input: 0, output: 1_000 }, { price_in: 0, price_out: 4_000_000 }, 300)
const a3 = clear(2_500, "A", { input: 3_000, output: 0 }, { price_in: 1_000_000, price_out: 0 }, 200)
const b1 = clear(1_500, "B", { input: 1_000, output: 0 }, { price_in: 10_000_000, price_out: 0 }, 50)
const fixture = [a1, a2, b1, a3]

describe("market data arithmetic against hand-computed fixtures", () => {
  it("the blended price is the charge per 1M tokens at the request's own mix, cached input at its rate", () => {
    assert.strictEqual(blendedPrice(a1), 2_000_000)
    const mixed = clear(
      0,
      "A",
      { input: 3_000, output: 1_000, cached: 1_000 },
      { price_in: 1_000_000, price_out: 2_000_000 }
    )
    // (2,000 × 1.0 + 1,000 × 1.0 + 1,000 × 2.0) / 4,000 tokens = 1,250,000 per 1M
    assert.strictEqual(blendedPrice(mixed), 1_250_000)
    assert.strictEqual(
      blendedPrice(clear(0, "A", { input: 0, output: 0 }, { price_in: 5, price_out: 5 })),
      null
    )
  })

  it("candles: a two-trade bucket, an explicit empty bucket and a one-trade bucket", () => {
    const series = candles([a1, a2, a3], grid)
    assert.deepStrictEqual(series, [
      {
        t: 0,
        open: 2_000_000,
        high: 4_000_000,
        low: 2_000_000,
        close: 4_000_000,
        vwap: 3_000_000,
        volume_tokens: 2_000,
        volume: 6_000,
        count: 2
      },
      {
        t: 1_000,
        open: null,
        high: null,
        low: null,
        close: null,
        vwap: null,
        volume_tokens: 0,
        volume: 0,
        count: 0
      },
      {
        t: 2_000,
        open: 1_000_000,
        high: 1_000_000,
        low: 1_000_000,
        close: 1_000_000,
        vwap: 1_000_000,
        volume_tokens: 3_000,
        volume: 3_000,
        count: 1
      }
    ])
  })

  it("the index weighs classes by cleared tokens and carries a quiet class's last VWAP", () => {
    const index = compositeIndex(fixture, ["A", "B", "C"], grid)
    assert.deepStrictEqual(
      index.components.map((c) => [c.model_class, c.volume_tokens, c.vwap]),
      [
        ["A", 5_000, 1_800_000],
        ["B", 1_000, 10_000_000],
        ["C", 0, null]
      ]
    )
    assert.closeTo(index.components[0]!.weight, 5 / 6, 1e-12)
    assert.closeTo(index.components[1]!.weight, 1 / 6, 1e-12)
    assert.strictEqual(index.components[2]!.weight, 0)
    // bucket 0: 5/6 × 3,000,000 + 1/6 × 10,000,000 (B back-filled); bucket 1: A carried; bucket 2: A at 1,000,000
    assert.deepStrictEqual(
      index.series.map((p) => p.value),
      [4_166_667, 4_166_667, 2_500_000]
    )
    assert.strictEqual(index.value, 2_500_000)
  })

  it("an index over a basket that never traded has equal weights and no value", () => {
    const index = compositeIndex(fixture, ["C", "D"], grid)
    assert.deepStrictEqual(
      index.components.map((c) => c.weight),
      [0.5, 0.5]
    )
    assert.deepStrictEqual(
      index.series.map((p) => p.value),
      [null, null, null]
    )
    assert.strictEqual(index.value, null)
  })

  it("stats: count, volume, VWAP, high, low, change and TTFT quantiles; a class with no clears", () => {
    assert.deepStrictEqual(classStats("A", fixture), {
      model_class: "A",
      count: 3,
      volume_tokens: 5_000,
      volume: 9_000,
      vwap: 1_800_000,
      high: 4_000_000,
      low: 1_000_000,
      open: 2_000_000,
      last: 1_000_000,
      change: -1_000_000,
      change_bps: -5_000,
      ttft_p50_ms: 200,
      ttft_p90_ms: 300
    })
    assert.deepStrictEqual(classStats("C", fixture), {
      model_class: "C",
      count: 0,
      volume_tokens: 0,
      volume: 0,
      vwap: null,
      high: null,
      low: null,
      open: null,
      last: null,
      change: null,
      change_bps: null,
      ttft_p50_ms: null,
      ttft_p90_ms: null
    })
  })

  it("HHI of provider shares: 10,000 for one seller, 5,000 for two equal, none when nothing sold", () => {
    assert.strictEqual(hhi([700]), 10_000)
    assert.strictEqual(hhi([50, 50]), 5_000)
    assert.strictEqual(hhi([60, 30, 10]), 4_600)
    assert.strictEqual(hhi([]), null)
    assert.strictEqual(hhi([0, 0]), null)
  })

  it("window and bucket bounds: a window above 24 h is refused, a narrow bucket widened to 1,440 points", () => {
    const ok = resolveGrid(10_500, SERIES_BOUNDS, 10_000, undefined)
    assert.deepStrictEqual(ok, {
      _tag: "Grid",
      grid: { windowMs: 10_000, bucketMs: 1_000, from: 1_000, to: 11_000, points: 10 }
    })
    const wide = resolveGrid(0, SERIES_BOUNDS, 86_400_000, 1)
    assert.strictEqual(wide._tag === "Grid" && wide.grid.bucketMs, 60_000)
    assert.strictEqual(wide._tag === "Grid" && wide.grid.points, 1_440)
    assert.strictEqual(resolveGrid(0, SERIES_BOUNDS, 86_400_001, undefined)._tag, "Refused")
    assert.strictEqual(resolveGrid(0, SERIES_BOUNDS, 0, undefined)._tag, "Refused")
    assert.strictEqual(resolveGrid(0, SERIES_BOUNDS, 60_000, -5)._tag, "Refused")
  })
})

const arbClear = fc
  .record({
    at: fc.integer({ min: 0, max: 9_999 }),
    cls: fc.constantFrom("A", "B", "C"),
    input: fc.integer({ min: 0, max: 50_000 }),
    output: fc.integer({ min: 0, max: 50_000 }),
    priceIn: fc.integer({ min: 0, max: 20_000_000 }),
    priceOut: fc.integer({ min: 0, max: 60_000_000 })
  })
  .map((r) =>
    clear(r.at, r.cls, { input: r.input, output: r.output }, { price_in: r.priceIn, price_out: r.priceOut })
  )

describe("market data properties", () => {
  const grid10: Grid = { windowMs: 10_000, bucketMs: 1_000, from: 0, to: 10_000, points: 10 }

  it("candles keep every clear once, and low ≤ open, close, VWAP ≤ high in every bucket", () =>
    fc.assert(
      fc.property(fc.array(arbClear, { maxLength: 60 }), (xs) => {
        const sorted = [...xs].sort(byTime)
        const series = candles(sorted, grid10)
        assert.strictEqual(series.length, 10)
        assert.strictEqual(
          series.reduce((n, c) => n + c.count, 0),
          xs.length
        )
        assert.strictEqual(
          series.reduce((n, c) => n + c.volume, 0),
          xs.reduce((n, c) => n + c.charged, 0)
        )
        for (const c of series) {
          if (c.low === null) continue
          for (const v of [c.open!, c.close!, c.vwap!]) {
            assert.isAtLeast(v, c.low)
            assert.isAtMost(v, c.high!)
          }
        }
      })
    ))

  it("index weights are in [0, 1] and sum to 1", () =>
    fc.assert(
      fc.property(
        fc.array(arbClear, { maxLength: 60 }),
        fc.subarray(["A", "B", "C", "D"], { minLength: 1 }),
        (xs, basket) => {
          const index = compositeIndex([...xs].sort(byTime), basket, grid10)
          const sum = index.components.reduce((n, c) => n + c.weight, 0)
          assert.closeTo(sum, 1, 1e-9)
          for (const c of index.components) assert.isTrue(c.weight >= 0 && c.weight <= 1)
        }
      )
    ))

  it("a resolved grid covers the window and `now`, with at most 1,440 buckets of at least 1 s", () =>
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 2 ** 42 }),
        fc.integer({ min: 1, max: SERIES_BOUNDS.maxWindowMs }),
        fc.option(fc.integer({ min: 1, max: 2 ** 31 }), { nil: undefined }),
        (now, window, bucket) => {
          const resolved = resolveGrid(now, SERIES_BOUNDS, window, bucket)
          assert.strictEqual(resolved._tag, "Grid")
          if (resolved._tag !== "Grid") return
          const g = resolved.grid
          assert.isAtMost(g.points, SERIES_BOUNDS.maxPoints)
          assert.isAtLeast(g.bucketMs, SERIES_BOUNDS.minBucketMs)
          assert.strictEqual(g.bucketMs % 1_000, 0, "whole seconds")
          assert.isTrue(g.from <= now && now < g.to)
          assert.strictEqual(g.to - g.from, g.points * g.bucketMs)
          assert.isAtLeast(g.to - g.from, window)
        }
      )
    ))

  it("HHI is within [share², 10,000] and 10,000 exactly for one seller", () =>
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 10 ** 9 }), { minLength: 1, maxLength: 12 }),
        (volumes) => {
          const value = hhi(volumes)
          const sellers = volumes.filter((v) => v > 0).length
          if (sellers === 0) return assert.strictEqual(value, null)
          assert.isAtLeast(value!, Math.floor(10_000 / sellers) - 1)
          assert.isAtMost(value!, 10_000)
          if (sellers === 1) assert.strictEqual(value, 10_000)
        }
      )
    ))
})
