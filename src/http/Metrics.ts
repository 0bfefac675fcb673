import { Effect, Metric } from "effect"

/** Low-cardinality HTTP metrics: route pattern (never a raw path), method, status. */
export const httpRequests = Metric.counter("http_requests_total", {
  description: "HTTP requests by route, method and status",
  incremental: true
})

export const httpDuration = Metric.histogram("http_request_duration_seconds", {
  description: "HTTP request latency by route, method and status",
  boundaries: Metric.exponentialBoundaries({ start: 0.001, factor: 2, count: 16 })
})

export const recordRequest = (
  attributes: { route: string; method: string; status: string },
  seconds: number
) =>
  Effect.all([
    Metric.update(Metric.withAttributes(httpRequests, attributes), 1),
    Metric.update(Metric.withAttributes(httpDuration, attributes), seconds)
  ]).pipe(Effect.asVoid)
