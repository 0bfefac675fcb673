import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import { makeElapsedClock } from "../../src/process/ElapsedClock.ts"

/**
 * D560: the clock for this process's own ages and gaps (a warm lease, its heartbeat) never steps back and never
 * counts less time than either the wall clock or the monotonic one has counted since it started.
 */
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

  it("a property: never back, never behind either clock's elapsed time, the wall's at the start", () =>
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 41 }), moves, (start, steps) => {
        let wall = start
        let monotonic = 1_234.5
        const clock = makeElapsedClock(
          () => wall,
          () => monotonic
        )
        const first = clock()
        assert.strictEqual(first, start)
        let last = first
        for (const { dt, step, missed } of steps) {
          wall += dt + step
          monotonic += dt - Math.min(missed, dt)
          const now = clock()
          assert.isAtLeast(now, last, "never back")
          assert.isAtLeast(now, wall, "never behind the wall clock's reading since the start")
          assert.isAtLeast(now - start, Math.floor(monotonic - 1_234.5), "never behind the monotonic time")
          assert.isTrue(Number.isInteger(now))
          last = now
        }
      })
    ))

  it("a step back of the wall clock: a lease's age keeps counting on the monotonic time", () => {
    let wall = 1_000_000
    let monotonic = 0
    const clock = makeElapsedClock(
      () => wall,
      () => monotonic
    )
    const takenAt = clock()
    // Ten minutes back, then five real minutes: the lease is five minutes old, not minus five.
    wall -= 600_000
    wall += 300_000
    monotonic += 300_000
    assert.strictEqual(clock() - takenAt, 300_000)
  })

  it("a suspension the monotonic clock missed: the gap is seen on the wall's", () => {
    let wall = 1_000_000
    const monotonic = 50
    const clock = makeElapsedClock(
      () => wall,
      () => monotonic
    )
    const beat = clock()
    wall += 40_000
    assert.strictEqual(clock() - beat, 40_000)
  })
})
