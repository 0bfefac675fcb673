import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import { chargeNumerator } from "../../src/domain/Billing.ts"
import {
  byTime,
  type ClearRecord,
  classStats,
  compositeIndex,
  type Grid
} from "../../src/marketdata/Series.ts"
import { ClearWindow } from "../../src/marketdata/Window.ts"

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
    .map((r): ClearRecord => {
      const num = Number(
        chargeNumerator(
          { input: r.input, cachedInput: 0, output: r.output },
          { price_in: r.priceIn, price_out: r.priceOut }
        )
      )
      return {
        id,
        requestId: `r${id}`,
        at: r.at,
        modelClass: r.cls,
        provider: "p",
        profile: "balanced",
        priceIn: r.priceIn,
        priceOut: r.priceOut,
        tokensIn: r.input,
        tokensOut: r.output,
        tokensCached: 0,
        chargeNum: num,
        charged: Math.ceil(num / 1_000_000),
        ttftMs: r.ttft,
        priceSetter: "runner-up",
        quotesCompeting: 1
      }
    })

const history = fc
  .integer({ min: 0, max: 80 })
  .chain((n) => fc.tuple(...Array.from({ length: n }, (_, i) => arbClear(i + 1))))
  .chain((clears) => fc.tuple(fc.constant(clears), fc.shuffledSubarray(clears, { minLength: clears.length })))

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
          for (const cls of ["A", "B", "C", "D"]) {
            assert.deepStrictEqual(window.stats([cls])[0], classStats(cls, kept))
          }
          const to = (Math.floor(now / HOUR) + 1) * HOUR
          const grid: Grid = { windowMs: STATS, bucketMs: HOUR, from: to - STATS, to, points: 24 }
          assert.deepStrictEqual(
            window.indexByMinutes(["A", "B", "C"], grid),
            compositeIndex(kept, ["A", "B", "C"], grid)
          )
          assert.deepStrictEqual(
            window.latest(5).map((c) => c.id),
            clears
              .filter((c) => c.at >= Math.min(statsFrom, now - STATS - HOUR))
              .sort(byTime)
              .slice(-5)
              .reverse()
              .map((c) => c.id)
          )
        }
      )
    ))
})
