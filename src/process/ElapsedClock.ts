/**
 * Milliseconds for the ages and gaps this process measures itself (a warm lease's age, a gap in its own
 * heartbeat), on a clock that never understates the time gone by when the wall clock moves oddly (D560,
 * D562). The wall clock steps when NTP or an operator sets it, back as well as forward; the monotonic one
 * (`performance.now()`, Linux's `CLOCK_MONOTONIC`) never steps but does not count a suspended machine.
 * The clock runs on the monotonic time, from the wall's reading at the start; whenever the wall has moved
 * further than the monotonic time since the previous reading (a suspension, a step forward), the excess is
 * added for good. So it always advances at least at the monotonic rate (a step back of the wall is ignored,
 * and a step forward corrected later does not freeze it), counts a suspension, and a step forward only
 * makes things look older, which is the safe side (a lease given back early, a gap seen).
 */
export const makeElapsedClock = (wall: () => number, monotonic: () => number) => {
  let lastWall = wall()
  let lastMonotonic = monotonic()
  // The clock is `monotonic() + offset`; the offset only grows.
  let offset = lastWall - lastMonotonic
  return (): number => {
    const wallNow = wall()
    const monotonicNow = monotonic()
    // Whole-ms wall readings against a fractional monotonic one differ by under 1 ms per pair of readings
    // with no step at all: only a larger excess is one.
    const excess = wallNow - lastWall - (monotonicNow - lastMonotonic)
    if (excess > EXCESS_MS) offset += excess
    lastWall = wallNow
    lastMonotonic = monotonicNow
    return Math.floor(monotonicNow + offset)
  }
}

/** How far the wall may run ahead of the monotonic clock between two readings before it counts (D562). */
const EXCESS_MS = 2

/** The process's one such clock. */
export const elapsedMs = makeElapsedClock(
  () => Date.now(),
  () => performance.now()
)
