import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import { makeElapsedClock } from "../../src/process/ElapsedClock.ts"

/**
 * D560, D562: the clock for this process's own ages and gaps (a warm lease, its heartbeat) never steps back,
 * always advances at least at the monotonic clock's rate, and counts what the wall clock ran ahead of it.
 */
/** A wall clock and a monotonic one the test sets, and the elapsed clock reading them. */
const settable = (wall: number, monotonic: number) => {
  const clocks = { wall, monotonic, read: () => 0 }
  clocks.read = makeElapsedClock(
    () => clocks.wall,
    () => clocks.monotonic
  )
  return clocks
}

describe("the elapsed clock", () => {
  // Real time advances by `dt`; the wall clock also steps by `step` (NTP, an operator), and the monotonic one
  // misses `missed` of it (a suspended machine).
  const moves = fc.array(
    fc.record({
      dt: fc.integer({ min: 0, max: 10_000 }),
      step: fc.oneof(fc.constant(0), fc.integer({ min: -600_000, max: 600_000 })),
      missed: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 10_000 }))
    }),
    { maxLength: 40 }
  )

  it("a property: never back, at least the monotonic time at every reading, and every forward jump of the wall", () =>
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 41 }), moves, (start, steps) => {
        const c = settable(start, 1_234.5)
        const first = c.read()
        assert.strictEqual(first, start)
        let last = first
        let forward = 0
        for (const { dt, step, missed } of steps) {
          const before = c.monotonic
          c.wall += dt + step
          c.monotonic += dt - Math.min(missed, dt)
          // What the wall moved beyond the monotonic clock (a step forward, a suspension) is counted for good,
          // past the 2 ms a whole-ms wall reading may differ by.
          const excess = dt + step - (c.monotonic - before)
          if (excess > 2) forward += excess
          const now = c.read()
          assert.isAtLeast(now, last, "never back")
          assert.isAtLeast(
            now - last,
            Math.floor(c.monotonic - before) - 1,
            "never slower than the monotonic clock"
          )
          assert.isAtLeast(
            now - start,
            Math.floor(c.monotonic - 1_234.5) + forward - 1,
            "every forward jump counted"
          )
          assert.isAtMost(now - start, Math.floor(c.monotonic - 1_234.5) + forward + 1, "and nothing else")
          assert.isTrue(Number.isInteger(now))
          last = now
        }
      })
    ))

  it("a step forward of the wall clock, corrected later: the clock does not stop (D562)", () => {
    const c = settable(1_000_000, 0)
    const takenAt = c.read()
    // An hour ahead, set right a second later: the lease looks an hour older (the safe side)...
    c.wall += 3_600_000
    assert.strictEqual(c.read() - takenAt, 3_600_000)
    c.wall -= 3_600_000
    c.wall += 1_000
    c.monotonic += 1_000
    assert.strictEqual(c.read() - takenAt, 3_601_000)
    // ...and keeps ageing on the monotonic time from there: five real minutes later it is five minutes older.
    c.wall += 300_000
    c.monotonic += 300_000
    assert.strictEqual(c.read() - takenAt, 3_901_000)
  })

  it("readings many times a millisecond run at the real rate, not faster", () => {
    const c = settable(1_000_000, 0.25)
    const first = c.read()
    // 100 real ms read every 0.1 ms: the whole-ms wall ticks once a ms, the monotonic clock moves on each read.
    for (let i = 1; i <= 1_000; i++) {
      c.monotonic = 0.25 + i / 10
      c.wall = 1_000_000 + Math.floor(i / 10)
      c.read()
    }
    assert.strictEqual(c.read() - first, 100)
  })

  it("a step back of the wall clock: a lease's age keeps counting on the monotonic time", () => {
    const c = settable(1_000_000, 0)
    const takenAt = c.read()
    // Ten minutes back, then five real minutes: the lease is five minutes old, not minus five.
    c.wall -= 600_000
    c.wall += 300_000
    c.monotonic += 300_000
    assert.strictEqual(c.read() - takenAt, 300_000)
  })

  it("a suspension the monotonic clock missed: the gap is seen on the wall's", () => {
    const c = settable(1_000_000, 50)
    const beat = c.read()
    c.wall += 40_000
    assert.strictEqual(c.read() - beat, 40_000)
  })
})
