import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import type { ClassStats } from "../../src/domain/MarketData.ts"
import {
  byTime,
  type ClearRecord,
  candles,
  classStats,
  compositeIndex,
  type Grid,
  resolveGrid,
  SERIES_BOUNDS
} from "../../src/marketdata/Series.ts"
import { ClearWindow } from "../../src/marketdata/Window.ts"
import { clearRecord, historyOf } from "./clears.ts"

const HOUR = 3_600_000
const STATS = 24 * HOUR

const arbClear = (id: number) =>
  fc
    .record({
      at: fc.integer({ min: 0, max: 30 * HOUR }),
      cls: fc.constantFrom("A", "B", "C"),
      input: fc.integer({ min: 0, max: 5_000 }),
      output: fc.integer({ min: 0, max: 5_000 }),
      priceIn: fc.integer({ min: 0, max: 9_000_000 }),
      priceOut: fc.integer({ min: 0, max: 30_000_000 }),
      ttft: fc.integer({ min: 0, max: 3_000 })
    })
    .map((r) => clearRecord(id, { ...r, provider: "p" }))

const history = historyOf(arbClear)

describe("the rolling window keeps what a pass over the clears would compute", () => {
  it("stats and the hourly index from per-minute aggregates equal a fresh pass, in any arrival order, after rolls", () =>
    fc.assert(
      fc.property(
        history,
        fc.array(fc.integer({ min: 0, max: 31 * HOUR }), { maxLength: 4 }),
        ([clears, arrival], rolls) => {
          const window = new ClearWindow(STATS, STATS + HOUR)
          const now = 31 * HOUR
          const steps = [...rolls].sort((a, b) => a - b)
          arrival.forEach((c, i) => {
            if (steps.length > 0 && i === Math.floor(arrival.length / 2))
              for (const t of steps) window.roll(t)
            window.add(c)
            window.add(c)
          })
          window.roll(now)
          const statsFrom = Math.floor((now - STATS) / 60_000) * 60_000
          // What a pass sees: every clear in the stats window that was not too old when it arrived.
          const kept = clears.filter((c) => c.at >= statsFrom).sort(byTime)
          // The TTFT quantiles are counted by hour and bucket (D549; windowBounded.test.ts); the rest is exact.
          const withoutTtfts = ({ ttft_p50_ms: _p50, ttft_p90_ms: _p90, ...rest }: ClassStats) => rest
          for (const cls of ["A", "B", "C", "D"]) {
            assert.deepStrictEqual(withoutTtfts(window.stats([cls])[0]!), withoutTtfts(classStats(cls, kept)))
          }
          const to = (Math.floor(now / HOUR) + 1) * HOUR
          const grid: Grid = { windowMs: STATS, bucketMs: HOUR, from: to - STATS, to, points: 24 }
          assert.deepStrictEqual(
            window.index(["A", "B", "C"], grid),
            compositeIndex(kept, ["A", "B", "C"], grid)
          )
          assert.deepStrictEqual(
            window.latest(5).map((c) => c.id),
            clears
              .filter((c) => c.at >= Math.floor(Math.min(statsFrom, now - STATS - HOUR) / 60_000) * 60_000)
              .sort(byTime)
              .slice(-5)
              .reverse()
              .map((c) => c.id)
          )
        }
      )
    ))

  it("candles and the index from minutes, hours and seconds equal a pass over the clears, for any grid", () =>
    fc.assert(
      fc.property(
        history,
        fc.array(fc.integer({ min: 0, max: 31 * HOUR }), { maxLength: 3 }),
        fc.integer({ min: 24 * HOUR, max: 31 * HOUR }),
        fc.integer({ min: 1, max: STATS }),
        fc.option(fc.integer({ min: 1, max: 30 * HOUR }), { nil: undefined }),
        fc.subarray(["A", "B", "C", "D"], { minLength: 1 }),
        ([clears, arrival], rolls, now, windowMs, bucketMs, basket) => {
          const window = new ClearWindow(STATS, STATS + HOUR)
          const steps = [...rolls].filter((t) => t <= now).sort((a, b) => a - b)
          const counted: Array<ClearRecord> = []
          arrival.forEach((c, i) => {
            if (steps.length > 0 && i === Math.floor(arrival.length / 2))
              for (const t of steps) window.roll(t)
            if (window.add(c)) counted.push(c)
          })
          // A read after clears came in: some hours were merged before the later clears of them arrived.
          const early = resolveGrid(now, SERIES_BOUNDS, STATS, HOUR)
          if (early._tag === "Grid") window.index(["A", "B", "C"], early.grid)
          for (const c of clears) {
            const later = { ...c, id: c.id + 1_000, at: c.at + 7 * 60_000 }
            if (window.add(later)) counted.push(later)
          }
          window.roll(now)
          const resolved = resolveGrid(now, SERIES_BOUNDS, windowMs, bucketMs)
          assert.strictEqual(resolved._tag, "Grid")
          if (resolved._tag !== "Grid") return
          const grid = resolved.grid
          // What a pass over the clears kept reads: those counted, in the minutes still kept.
          const statsFrom = Math.floor((now - STATS) / 60_000) * 60_000
          const keptFrom = Math.floor(Math.min(statsFrom, now - STATS - HOUR) / 60_000) * 60_000
          const raw = counted
            .filter((c) => c.at >= keptFrom && c.at >= grid.from && c.at < grid.to)
            .sort(byTime)
          for (const cls of basket) {
            assert.deepStrictEqual(
              window.candles([cls], grid),
              candles(
                raw.filter((c) => c.modelClass === cls),
                grid
              )
            )
          }
          assert.deepStrictEqual(window.candles(window.classes(), grid), candles(raw, grid))
          assert.deepStrictEqual(window.index(basket, grid), compositeIndex(raw, basket, grid))
        }
      )
    ))

  it("a bucket of a minute or more, and every bucket of a window over an hour, is whole minutes; any other whole seconds", () => {
    const at = (window: number, bucket: number | undefined) => {
      const resolved = resolveGrid(1_000_000_000, SERIES_BOUNDS, window, bucket)
      return resolved._tag === "Grid" ? resolved.grid.bucketMs : null
    }
    assert.strictEqual(at(STATS, 90_000), 60_000)
    assert.strictEqual(at(STATS, 150_000), 120_000)
    assert.strictEqual(at(2 * HOUR, 5_000), 60_000)
    assert.strictEqual(at(23 * HOUR, undefined), 23 * 60_000)
    assert.strictEqual(at(HOUR, 5_000), 5_000)
    assert.strictEqual(at(HOUR, 61_500), 60_000)
    assert.strictEqual(at(10 * 60_000, 1), 1_000)
    // Any other bucket is whole seconds (D551): the last hour is kept per second.
    assert.strictEqual(at(HOUR, 7_500), 7_000)
    assert.strictEqual(at(10 * 60_000, 1_999), 1_000)
    assert.strictEqual(at(HOUR, undefined), 60_000)
    // Rounded down would take the grid past its 1,440 points: up to the next whole second instead.
    assert.strictEqual(at(1_440_001, 1), 2_000)
  })
})
