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
 * flight, none started since the last look, and the heap in use is `GROWTH` above what the last full
 * collection left, this runs one. It needs `--expose-gc` (`npm start` passes it); without it, nothing runs.
 */
const PERIOD = "2 seconds"
const GROWTH = 64 * 1024 * 1024

export interface Activity {
  /** HTTP responses started and not yet closed. */
  readonly inFlight: number
  /** Requests started since the previous look. */
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

export const IdleCollection = {
  layer: Layer.effectDiscard(
    Effect.gen(function* () {
      const gc = exposedGc()
      if (gc === undefined) return
      let inFlight = 0
      let started = 0
      const onStart = (message: unknown) => {
        const { response } = message as { request: IncomingMessage; response: ServerResponse }
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
      // No full collection has run yet: counted from an empty heap, the first quiet look collects what
      // starting left (migrations, contract deployment, compilation; D342), once the heap is `GROWTH`.
      let afterLast = 0
      let lastFreed = 0
      yield* Effect.sync(() => {
        const activity = { inFlight, started }
        started = 0
        const used = v8.getHeapStatistics().used_heap_size
        if (shouldCollect(activity, used, afterLast, lastFreed)) {
          gc(COMPACTING)
          afterLast = v8.getHeapStatistics().used_heap_size
          lastFreed = used - afterLast
        } else if (used < afterLast) {
          afterLast = used
        }
      }).pipe(Effect.repeat(Schedule.spaced(PERIOD)), Effect.forkScoped)
    })
  )
}
