import diagnostics from "node:diagnostics_channel"
import type { IncomingMessage, ServerResponse } from "node:http"
import v8 from "node:v8"
import { Clock, Effect, Layer, Schedule } from "effect"

/**
 * One full collection when the router goes quiet after its heap grew (issue 12 item 5, D271).
 *
 * V8 collects its old generation when allocation reaches a limit set from what was live at the last
 * collection. After a burst (5,000 held streams: about 500 MB live) that limit is near 1 GB, and a router
 * that then goes quiet allocates too little to reach it: the burst's garbage stays in the heap, and its
 * pages in RSS, indefinitely (Node runs no idle-time collection; measured: 1,009 MB heap in use 16 s and
 * 60 s after the streams ended, 148 MB once collected). So every `PERIOD`, when no HTTP response is in
 * flight, none started since the last look, no look for `QUIET_MS` (from the start, at first) saw more than
 * a trickle (`isBusy`), and the old generation's heap in use is `GROWTH` above what the last full collection
 * left, this runs one. It needs `--expose-gc` (`npm start` passes it); without
 * it, nothing runs.
 * Health probes and metric scrapes are not work (D405): an orchestrator probing every second or two would
 * otherwise start a request between every two looks, and the router would never be quiet.
 */
const PERIOD = "2 seconds"
/**
 * How long the process must have been quiet before it collects (D552): 30 s, not one look. A full collection
 * of a quiet process also drops the optimized code of every function whose closures are all dead, which
 * is most of a request's path (V8 holds a closure site's optimized code weakly, and a request's closures die
 * with it): the next burst recompiled about 420 functions and ran 25-30% more CPU a call for its first
 * seconds. Lulls shorter than this (a caller's pause, the gaps between a benchmark's phases) keep the code;
 * a router quiet for this long gives its memory back as before, 30 s into the quiet instead of 2.
 */
export const QUIET_MS = 30_000
/**
 * 16 MB (64 MB before D411): a warm-up's garbage (about 40 MB after a few hundred priced requests) stayed
 * below 64 MB, and with it its pages in RSS, for as long as the router stayed quiet.
 */
const GROWTH = 16 * 1024 * 1024

/**
 * The heap in use outside the young generation: what a full collection is for. The young generation
 * (up to tens of MB of a quiet router's background work, taken by the next scavenge) is left out, or a
 * quiet router would run a compacting collection every look.
 */
const oldUsed = () => {
  let used = 0
  for (const space of v8.getHeapSpaceStatistics())
    if (space.space_name !== "new_space" && space.space_name !== "new_large_object_space")
      used += space.space_used_size
  return used
}

const PROBES = new Set(["/health", "/ready", "/metrics"])
/**
 * Requests that are not work for the idle collection: health probes and metric scrapes (D405), and providers'
 * standing quotes (D552), which every provider posts every few seconds whether or not anyone calls.
 */
const BACKGROUND = new Set([...PROBES, "/provider/quotes"])
const pathOf = (url: string) => {
  const query = url.indexOf("?")
  return query === -1 ? url : url.slice(0, query)
}
/** Whether a request's URL is a health probe or a metrics scrape (its path, whatever its query). */
export const isProbe = (url: string | undefined) => url !== undefined && PROBES.has(pathOf(url))
/** Whether a request is background traffic, not work: a probe, a scrape or a provider's quote. */
export const isBackground = (url: string | undefined) => url !== undefined && BACKGROUND.has(pathOf(url))

export interface Activity {
  /** HTTP responses started and not yet closed (background traffic not counted). */
  readonly inFlight: number
  /** Requests started since the previous look (background traffic not counted). */
  readonly started: number
}

/**
 * At most this many requests started since the previous look (one a second) and none in flight: a light look,
 * which does not end the quiet span (a dashboard's polls, an agent's occasional call), though a collection
 * itself still waits for a look with nothing started.
 */
export const LIGHT_STARTS = 2

/** Whether a look ends the quiet span: something in flight, or more than a light trickle started. */
export const isBusy = (activity: Activity) => activity.inFlight > 0 || activity.started > LIGHT_STARTS

/**
 * Whether to collect now: quiet since the last look and for at least `quietFor` (`quietMs`, QUIET_MS in the
 * router), and grown enough since the last collection or the last collection freed enough that another may
 * free more.
 */
export const shouldCollect = (
  activity: Activity,
  heapUsed: number,
  afterLastCollection: number,
  lastFreed = 0,
  quietForMs = Number.POSITIVE_INFINITY,
  quietMs = QUIET_MS
) =>
  activity.inFlight === 0 &&
  activity.started === 0 &&
  quietForMs >= quietMs &&
  (heapUsed - afterLastCollection >= GROWTH || lastFreed >= GROWTH)

interface GcOptions {
  readonly type: "major"
  readonly execution: "sync"
  readonly flavor: "last-resort"
}

const exposedGc = (): ((options: GcOptions) => void) | undefined => {
  const gc = (globalThis as { gc?: unknown }).gc
  return typeof gc === "function" ? (gc as (options: GcOptions) => void) : undefined
}

/** V8's compacting full collection: live objects moved together, emptied pages released. */
const COMPACTING: GcOptions = { type: "major", execution: "sync", flavor: "last-resort" }

/**
 * The HTTP work this process's servers do, as Node reports each request's start: `look` answers the
 * responses in flight and the requests started since the previous look. Background traffic (probes, scrapes,
 * providers' quotes) is not counted.
 */
export const httpActivity = Effect.gen(function* () {
  let inFlight = 0
  let started = 0
  const onStart = (message: unknown) => {
    const { request, response } = message as { request: IncomingMessage; response: ServerResponse }
    if (isBackground(request.url)) return
    inFlight++
    started++
    // `close` comes for a finished response and for one cut off alike.
    response.once("close", () => {
      inFlight--
    })
  }
  yield* Effect.acquireRelease(
    Effect.sync(() => diagnostics.subscribe("http.server.request.start", onStart)),
    () => Effect.sync(() => diagnostics.unsubscribe("http.server.request.start", onStart))
  )
  return {
    look: (): Activity => {
      const activity = { inFlight, started }
      started = 0
      return activity
    }
  }
})

/** Looks every `PERIOD` and collects once the process has been quiet for `quietMs`. */
const collectingAfter = (quietMs: number) =>
  Layer.effectDiscard(
    Effect.gen(function* () {
      const gc = exposedGc()
      if (gc === undefined) return
      const activity = yield* httpActivity
      // No full collection has run yet: counted from an empty heap, the first quiet look collects what
      // starting left (migrations, contract deployment, compilation; D342), once the heap is `GROWTH`.
      let afterLast = 0
      let lastFreed = 0
      // The last busy look (or the start): the process has been quiet, or nearly, since then at least.
      let busyAt = yield* Clock.currentTimeMillis
      yield* Effect.gen(function* () {
        const at = yield* Clock.currentTimeMillis
        const now = activity.look()
        if (isBusy(now)) busyAt = at
        const used = oldUsed()
        if (shouldCollect(now, used, afterLast, lastFreed, at - busyAt, quietMs)) {
          gc(COMPACTING)
          afterLast = oldUsed()
          lastFreed = used - afterLast
        } else if (used < afterLast) {
          afterLast = used
        }
      }).pipe(Effect.repeat(Schedule.spaced(PERIOD)), Effect.forkScoped)
    })
  )

export const IdleCollection = {
  layer: collectingAfter(QUIET_MS),
  /** The same with another quiet span (the tests' child process). */
  collectingAfter
}
