/**
 * Milliseconds for the ages and gaps this process measures itself (a warm lease's age, a gap in its own
 * heartbeat), on a clock that never understates the time gone by when either of the machine's clocks moves
 * oddly (D560). The wall clock steps when NTP or an operator sets it, back as well as forward; the monotonic one
 * (`performance.now()`, Linux's `CLOCK_MONOTONIC`) never steps but may not count a suspended machine. Each
 * reading is the wall clock at the start plus the larger of the two elapsed times since, never less than the
 * last reading: a step back of the wall clock leaves it on the monotonic time, a suspension on the wall's, and
 * a step forward makes things look older, which is the safe side (a lease given back early, a gap seen).
 */
export const makeElapsedClock = (wall: () => number, monotonic: () => number) => {
  const wallStart = wall()
  const monotonicStart = monotonic()
  let last = wallStart
  return (): number => {
    const elapsed = Math.max(wall() - wallStart, Math.floor(monotonic() - monotonicStart))
    last = Math.max(last, wallStart + elapsed)
    return last
  }
}

/** The process's one such clock. */
export const elapsedMs = makeElapsedClock(
  () => Date.now(),
  () => performance.now()
)
