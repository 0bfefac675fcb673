import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import type { ClassStats } from "../../src/domain/MarketData.ts"
import {
  byTime,
  type ClearRecord,
  candles,
  classStats,
  type Grid,
  quantile,
  tokensOf
} from "../../src/marketdata/Series.ts"
import {
  bucketFloor,
  countedTtft,
  TTFT_BUCKETS,
  TtftHours,
  ttftBucket
} from "../../src/marketdata/TtftHours.ts"
import { ClearWindow, SEEN_IDS } from "../../src/marketdata/Window.ts"
import { clearRecord, historyOf } from "./clears.ts"

const MINUTE = 60_000
const HOUR = 60 * MINUTE
const STATS = 24 * HOUR
const RAW = HOUR + MINUTE

const clearOf = (
  id: number,
  r: { at: number; cls: string; provider: string; input: number; output: number; ttft: number }
): ClearRecord => clearRecord(id, { ...r, priceIn: 1_000_000 + 7 * id, priceOut: 3_000_000 })

const arbClear = (id: number) =>
  fc
    .record({
      at: fc.integer({ min: 0, max: 30 * HOUR }),
      cls: fc.constantFrom("A", "B", "C"),
      provider: fc.constantFrom("p1", "p2", "p3"),
      input: fc.integer({ min: 0, max: 5_000 }),
      output: fc.integer({ min: 0, max: 5_000 }),
      ttft: fc.integer({ min: 0, max: 400 })
    })
    .map((r) => clearOf(id, r))

const history = historyOf(arbClear)

// D549, D551: what the window keeps does not grow with the clears it counted: aggregates per minute, and per
// second for the last hour and a minute, TTFTs in hourly histograms, providers' figures per minute, the newest
// clears for the tape; every read answers as a pass over the clears would.
describe("the rolling window keeps counts, not clears", () => {
  it("stats, a provider's day, the tape, the last hour's and the day's candles equal a pass over the clears", () =>
    fc.assert(
      fc.property(
        history,
        fc.array(fc.integer({ min: 0, max: 31 * HOUR }), { maxLength: 4 }),
        ([, arrival], rolls) => {
          const window = new ClearWindow(STATS, STATS + HOUR, RAW)
          const now = 31 * HOUR
          const steps = [...rolls].sort((a, b) => a - b)
          // What a pass sees: each clear that arrived while its minute was still kept (the rolls move that on),
          // and its TTFT when it arrived within the stats window.
          let keepFrom = Number.NEGATIVE_INFINITY
          let statsFromThen = Number.NEGATIVE_INFINITY
          const counted: Array<ClearRecord> = []
          const timed: Array<ClearRecord> = []
          arrival.forEach((c, i) => {
            if (steps.length > 0 && i === Math.floor(arrival.length / 2)) {
              for (const t of steps) {
                window.roll(t)
                const statsFrom = Math.floor((t - STATS) / MINUTE) * MINUTE
                statsFromThen = Math.max(statsFromThen, statsFrom)
                keepFrom = Math.max(
                  keepFrom,
                  Math.floor(Math.min(statsFrom, t - STATS - HOUR) / MINUTE) * MINUTE
                )
              }
            }
            if (window.add(c)) {
              counted.push(c)
              if (c.at >= statsFromThen) timed.push(c)
            }
            assert.isFalse(window.add(c), "a clear is counted once")
            if (c.at >= keepFrom) assert.include(counted, c)
          })
          window.roll(now)
          const statsFrom = Math.floor((now - STATS) / MINUTE) * MINUTE
          const inStats = counted.filter((c) => c.at >= statsFrom).sort(byTime)
          // TTFTs: those counted, of the hours that overlap the stats window, each as its bucket counts it.
          const inHours = timed.filter((c) => c.at - (c.at % HOUR) + HOUR > statsFrom)
          const ttftsOf = (keep: (c: ClearRecord) => boolean) =>
            inHours
              .filter(keep)
              .map((c) => countedTtft(c.ttftMs))
              .sort((a, b) => a - b)
          for (const cls of ["A", "B", "C", "D"]) {
            const ttfts = ttftsOf((c) => c.modelClass === cls)
            const expected: ClassStats = {
              ...classStats(cls, inStats),
              ttft_p50_ms: quantile(ttfts, 0.5),
              ttft_p90_ms: quantile(ttfts, 0.9)
            }
            assert.deepStrictEqual(window.stats([cls])[0], expected)
          }
          for (const provider of ["p1", "p2", "p3", "p4"]) {
            const own = inStats.filter((c) => c.provider === provider)
            const day = window.provider(provider)
            if (own.length === 0) {
              assert.isUndefined(day)
              continue
            }
            const ttfts = ttftsOf((c) => c.provider === provider)
            assert.deepStrictEqual(
              {
                clears: day!.clears,
                volume: day!.volume,
                tokens: day!.tokens,
                classes: [...day!.classes].sort(),
                ttfts: [0.5, 0.9, 0.99].map(day!.ttftQuantile)
              },
              {
                clears: own.length,
                volume: own.reduce((s, c) => s + c.charged, 0),
                tokens: own.reduce((s, c) => s + tokensOf(c), 0),
                classes: [...new Set(own.map((c) => c.modelClass))].sort(),
                ttfts: [0.5, 0.9, 0.99].map((q) => quantile(ttfts, q))
              }
            )
          }
          // The tape: the newest clears counted in the minutes kept.
          const minutesKept = Math.floor(Math.min(statsFrom, now - STATS - HOUR) / MINUTE) * MINUTE
          const kept = counted.filter((c) => c.at >= minutesKept).sort(byTime)
          assert.deepStrictEqual(
            window.latest(5).map((c) => c.id),
            kept
              .slice(-5)
              .reverse()
              .map((c) => c.id)
          )
          // The last hour in seconds: candles of 7 s buckets from the per-second aggregates, as a pass over the
          // clears of the raw window; never more than a second's aggregate per class of it.
          const rawFrom = Math.floor((now - RAW) / MINUTE) * MINUTE
          const secondsTo = (Math.floor(now / 7_000) + 1) * 7_000
          const seconds: Grid = {
            windowMs: HOUR,
            bucketMs: 7_000,
            from: secondsTo - 515 * 7_000,
            to: secondsTo,
            points: 515
          }
          assert.deepStrictEqual(
            window.candles(window.classes(), seconds),
            candles(
              counted
                .filter((c) => c.at >= Math.max(rawFrom, seconds.from) && c.at < seconds.to)
                .sort(byTime),
              seconds
            )
          )
          assert.isAtMost(window.heldSeconds, 3 * (RAW / 1_000))
          // A day of hourly candles from the minutes, with no raw clear older than the hour.
          const to = (Math.floor(now / HOUR) + 1) * HOUR
          const grid: Grid = { windowMs: STATS, bucketMs: HOUR, from: to - STATS, to, points: 24 }
          assert.deepStrictEqual(
            window.candles(window.classes(), grid),
            candles(counted.filter((c) => c.at >= minutesKept).sort(byTime), grid)
          )
        }
      )
    ))

  it("a TTFT counts exactly below 128 ms and within 1.6% above; buckets run in order, each its own least value", () => {
    for (const v of [0, 1, 50, 80, 100, 120, 127, 128, 200, 300]) assert.strictEqual(countedTtft(v), v)
    for (let b = 0; b < TTFT_BUCKETS; b++) assert.strictEqual(ttftBucket(bucketFloor(b)), b)
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 20 - 1 }), (v) => {
        const counted = countedTtft(v)
        assert.isAtMost(counted, v)
        assert.isAtMost(v - counted, v / 64)
      })
    )
    assert.strictEqual(ttftBucket(10 ** 9), TTFT_BUCKETS - 1)
  })

  it("hourly TTFT histograms give the nearest-rank quantiles of what they hold, and let an hour go whole", () =>
    fc.assert(
      fc.property(
        fc.array(
          fc.record({ hour: fc.integer({ min: 0, max: 3 }), ttft: fc.integer({ min: 0, max: 5_000 }) }),
          {
            maxLength: 200
          }
        ),
        fc.integer({ min: 0, max: 4 }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (values, cut, q) => {
          const hours = new TtftHours()
          for (const { hour, ttft } of values) hours.add("k", hour * HOUR + 17, ttft)
          hours.roll(cut * HOUR)
          const kept = values
            .filter((v) => v.hour >= cut)
            .map((v) => countedTtft(v.ttft))
            .sort((a, b) => a - b)
          assert.strictEqual(hours.quantile("k", q), quantile(kept, q))
        }
      )
    ))

  it("remembers the newest ids it counted: a repeat among them is refused, the window does not grow with them", () => {
    const window = new ClearWindow(STATS, STATS + HOUR, RAW)
    const now = 30 * HOUR
    window.roll(now)
    const n = SEEN_IDS + 5_000
    for (let id = 1; id <= n; id++) {
      window.add(
        clearOf(id, {
          at: now - STATS + (id % STATS),
          cls: "A",
          provider: "p1",
          input: 10,
          output: 10,
          ttft: id % 300
        })
      )
    }
    const repeat = clearOf(n - 10, { at: now - 1, cls: "A", provider: "p1", input: 10, output: 10, ttft: 5 })
    assert.isFalse(window.add(repeat))
    assert.strictEqual(window.stats(["A"])[0]!.count, n)
    assert.strictEqual(window.rememberedIds, SEEN_IDS)
    // Only the last hour and a minute in seconds: one class, at most one aggregate a second.
    assert.isAtMost(window.heldSeconds, RAW / 1_000)
  })

  it("keeps a second's aggregate per class only for the last hour and a minute, however long it counts", () => {
    const window = new ClearWindow(STATS, STATS + HOUR, RAW)
    const start = 30 * HOUR
    let id = 0
    // Three hours of a clear a second in each of three classes, rolled every minute as the service rolls it.
    for (let t = start; t < start + 3 * HOUR; t += 1_000) {
      if (t % MINUTE === 0) window.roll(t)
      for (const cls of ["A", "B", "C"]) {
        window.add(clearOf(++id, { at: t, cls, provider: "p1", input: 10, output: 10, ttft: 50 }))
      }
    }
    window.roll(start + 3 * HOUR)
    assert.isAtMost(window.heldSeconds, 3 * (RAW / 1_000 + 60))
    assert.isAtLeast(window.heldSeconds, 3 * (HOUR / 1_000))
    assert.strictEqual(window.stats(["A"])[0]!.count, 3 * 3_600)
  })
})
