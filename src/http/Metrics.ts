import { type Context, Effect, Metric } from "effect"

/** Low-cardinality HTTP metrics: route pattern (never a raw path), method, status. */
export const httpRequests = Metric.counter("http_requests_total", {
  description: "HTTP requests by route, method and status",
  incremental: true
})

export const httpDuration = Metric.histogram("http_request_duration_seconds", {
  description: "HTTP request latency by route, method and status",
  boundaries: Metric.exponentialBoundaries({ start: 0.001, factor: 2, count: 16 })
})

/** The two series of one route, method and status, made once (there are a few hundred at most). */
const seriesByKey = new Map<
  string,
  { readonly count: Metric.Metric<number, unknown>; readonly duration: Metric.Metric<number, unknown> }
>()
const seriesOf = (attributes: { route: string; method: string; status: string }) => {
  const key = `${attributes.method} ${attributes.status} ${attributes.route}`
  let series = seriesByKey.get(key)
  if (series === undefined) {
    series = {
      count: Metric.withAttributes(httpRequests, attributes),
      duration: Metric.withAttributes(httpDuration, attributes)
    }
    seriesByKey.set(key, series)
  }
  return series
}

/** Counts and times one request, in one step (it runs on every request). */
export const recordRequest = (
  attributes: { route: string; method: string; status: string },
  seconds: number
) =>
  Effect.contextWith((context: Context.Context<never>) => {
    const series = seriesOf(attributes)
    series.count.updateUnsafe(1, context)
    series.duration.updateUnsafe(seconds, context)
    return Effect.void
  })

/** The process's own memory, as Prometheus's Node conventions name it (the load benchmark reads these). */
const residentMemory = Metric.gauge("process_resident_memory_bytes", {
  description: "Resident memory of this router process"
})
const heapUsed = Metric.gauge("nodejs_heap_size_used_bytes", {
  description: "V8 heap in use by this router process"
})
const heapTotal = Metric.gauge("nodejs_heap_size_total_bytes", {
  description: "V8 heap reserved by this router process"
})
const externalMemory = Metric.gauge("nodejs_external_memory_bytes", {
  description: "Memory of this router process outside the V8 heap held by JavaScript objects (buffers)"
})

/** Reads the process's memory into its gauges (at each scrape). */
export const refreshProcessGauges = Effect.suspend(() => {
  const memory = process.memoryUsage()
  return Effect.all([
    Metric.update(residentMemory, memory.rss),
    Metric.update(heapUsed, memory.heapUsed),
    Metric.update(heapTotal, memory.heapTotal),
    Metric.update(externalMemory, memory.external + memory.arrayBuffers)
  ]).pipe(Effect.asVoid)
})
