import { constants, PerformanceObserver } from "node:perf_hooks"
import { Effect, Layer, Metric } from "effect"

/**
 * The garbage collector's pauses of this process's main thread, by kind, as Prometheus's Node conventions
 * name them (`nodejs_gc_duration_seconds`, `kind` = minor, major, incremental, weakcb). Under load the
 * young generation's collections are a tenth of the router's main thread (issue 12, D569), and the load
 * benchmark reads this per request.
 */
export const gcDuration = Metric.histogram("nodejs_gc_duration_seconds", {
  description: "Garbage collection pauses of the main thread, by kind",
  boundaries: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1]
})

const KINDS: ReadonlyArray<readonly [number, string]> = [
  [constants.NODE_PERFORMANCE_GC_MINOR, "minor"],
  [constants.NODE_PERFORMANCE_GC_MAJOR, "major"],
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL, "incremental"],
  [constants.NODE_PERFORMANCE_GC_WEAKCB, "weakcb"]
]

/** The kind a `gc` performance entry names (`detail.kind`), as the metric's attribute. */
export const gcKindOf = (kind: number | undefined) => KINDS.find(([flag]) => flag === kind)?.[1] ?? "other"

/**
 * Observes every collection while the layer is up: the observer is made and started in one step with its
 * disconnection registered, so it goes with the process's scope whatever way that closes.
 */
export const GcMetricsLive = Layer.effectDiscard(
  Effect.gen(function* () {
    const context = yield* Effect.context<never>()
    const byKind = new Map(
      [...KINDS.map(([, kind]) => kind), "other"].map((kind) => [
        kind,
        Metric.withAttributes(gcDuration, { kind })
      ])
    )
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        const observer = new PerformanceObserver((list) => {
          for (const entry of list.getEntries()) {
            // A `gc` entry's detail is `{ kind, flags }` (Node's typings leave it out of PerformanceEntry).
            const kind = gcKindOf((entry as { readonly detail?: { readonly kind?: number } }).detail?.kind)
            byKind.get(kind)!.updateUnsafe(entry.duration / 1000, context)
          }
        })
        observer.observe({ entryTypes: ["gc"] })
        return observer
      }),
      (observer) => Effect.sync(() => observer.disconnect())
    )
  })
)
