import diagnostics from "node:diagnostics_channel"
import type { IncomingMessage, ServerResponse } from "node:http"
import v8 from "node:v8"
import { Effect, Layer, Schedule } from "effect"

/**
 * One full collection when the router goes quiet after its heap grew (issue 12 item 5, D271).
 *
 * V8 collects its old generation when allocation reaches a limit set from what was live at the last
 * collection. After a burst (5,000 held streams: about 500 MB live) that limit is near 1 GB, and a router
 * that then goes quiet allocates too little to reach it: the burst's garbage stays in the heap, and its
 * pages in RSS, indefinitely (Node runs no idle-time collection; measured: 1,009 MB heap in use 16 s and
 * 60 s after the streams ended, 148 MB once collected). So every `PERIOD`, when no HTTP response is in
 * flight, none started since the last look, and the old generation's heap in use is `GROWTH` above what
 * the last full collection left, this runs one. It needs `--expose-gc` (`npm start` passes it); without
 * it, nothing runs.
 * Health probes and metric scrapes are not work (D405): an orchestrator probing every second or two would
 * otherwise start a request between every two looks, and the router would never be quiet.
 */
const PERIOD = "2 seconds"
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
/** Whether a request's URL is a health probe or a metrics scrape (its path, whatever its query). */
export const isProbe = (url: string | undefined) => {
  if (url === undefined) return false
  const query = url.indexOf("?")
  return PROBES.has(query === -1 ? url : url.slice(0, query))
}

export interface Activity {
  /** HTTP responses started and not yet closed (probes not counted). */
  readonly inFlight: number
  /** Requests started since the previous look (probes not counted). */
  readonly started: number
}

/**
 * Whether to collect now: quiet since the last look, and grown enough since the last collection or the
 * last collection freed enough that another may free more.
 */
export const shouldCollect = (
  activity: Activity,
  heapUsed: number,
  afterLastCollection: number,
  lastFreed = 0
) =>
  activity.inFlight === 0 &&
  activity.started === 0 &&
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
 * responses in flight and the requests started since the previous look. Probes are not counted.
 */
export const httpActivity = Effect.gen(function* () {
  let inFlight = 0
  let started = 0
  const onStart = (message: unknown) => {
    const { request, response } = message as { request: IncomingMessage; response: ServerResponse }
    if (isProbe(request.url)) return
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

export const IdleCollection = {
  layer: Layer.effectDiscard(
    Effect.gen(function* () {
      const gc = exposedGc()
      if (gc === undefined) return
      const activity = yield* httpActivity
      // No full collection has run yet: counted from an empty heap, the first quiet look collects what
      // starting left (migrations, contract deployment, compilation; D342), once the heap is `GROWTH`.
      let afterLast = 0
      let lastFreed = 0
      yield* Effect.sync(() => {
        const now = activity.look()
        const used = oldUsed()
        if (shouldCollect(now, used, afterLast, lastFreed)) {
          gc(COMPACTING)
          afterLast = oldUsed()
          lastFreed = used - afterLast
        } else if (used < afterLast) {
          afterLast = used
        }
      }).pipe(Effect.repeat(Schedule.spaced(PERIOD)), Effect.forkScoped)
    })
  )
}
