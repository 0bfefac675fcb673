import { existsSync, readFileSync } from "node:fs"
import { availableParallelism, loadavg } from "node:os"

/**
 * Wall time, and how much a shared machine slowed it down.
 *
 * A time the project promises ("the fleet's quotes are in the book within 15 s of `npm start`") is stated
 * for a machine that runs nothing else. Where several suites share two cores every runnable thread also
 * waits its turn for a CPU, and Linux counts that wait per thread: `/proc/<pid>/task/<tid>/schedstat`
 * holds the nanoseconds it ran and the nanoseconds it waited, runnable, for a CPU. Over the measured window
 *
 *     stretch = (ran + waited) / ran
 *
 * is how much longer the measured thread's own work took than it would have on an idle machine (1 when
 * nothing competed for the CPU). A test multiplies the promised time by it: the promise is still checked
 * at full strength on an idle machine (CI), and a loaded one cannot fail it. Without schedstat (another OS)
 * the stretch is 1 and the bound is the plain promise.
 */
export interface Stopwatch {
  /** Milliseconds since the stopwatch started. */
  readonly elapsedMs: () => number
  /** The slowdown of the measured thread since the stopwatch started (at least 1). */
  readonly stretch: () => number
}

const schedstatOf = (path: string): { ran: number; waited: number } | undefined => {
  try {
    const [ran, waited] = readFileSync(path, "utf8").trim().split(" ").map(Number)
    return ran !== undefined && waited !== undefined && Number.isFinite(ran + waited)
      ? { ran, waited }
      : undefined
  } catch {
    return undefined
  }
}

/**
 * Starts a stopwatch on the main thread of process `pid` (default: the calling thread). Read `stretch`
 * while that thread is still alive.
 */
export const startStopwatch = (pid?: number): Stopwatch => {
  const path = pid === undefined ? "/proc/thread-self/schedstat" : `/proc/${pid}/task/${pid}/schedstat`
  const started = performance.now()
  const at = existsSync(path) ? schedstatOf(path) : undefined
  return {
    elapsedMs: () => performance.now() - started,
    stretch: () => {
      const now = at === undefined ? undefined : schedstatOf(path)
      if (at === undefined || now === undefined) return 1
      const ran = now.ran - at.ran
      const waited = now.waited - at.waited
      return ran > 0 ? Math.max(1, (ran + waited) / ran) : 1
    }
  }
}

/**
 * The slowdown a shared machine is expected to cause, for bounds that must be fixed before the work starts
 * (a test's own timeout, a wait on another process): the runnable threads per core over the last minute
 * (`loadavg / cores`, at least 1). It is 1 on a machine that runs nothing else (CI), so the bound there is
 * the plain one; where other suites keep every core busy several times over, a thread gets its CPU that
 * much less often and the bound grows with it. Where a thread's own schedstat can be read over the measured
 * window, `startStopwatch` is the better measure.
 */
export const loadStretch = (): number => {
  const [oneMinute] = loadavg()
  return Math.max(1, (oneMinute ?? 0) / availableParallelism())
}
