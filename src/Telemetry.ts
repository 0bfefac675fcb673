import type { SpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Config, Effect, Layer, Option, References, type Tracer } from "effect"

/**
 * Tracing. Span attributes carry ids, classes, winners and prices; never a prompt, a
 * reply, a credit key, a private key or a payment envelope.
 */
export const tracingWith = (processors: ReadonlyArray<SpanProcessor>) =>
  Layer.unwrap(
    // Loaded only where spans are exported: the OpenTelemetry SDK is megabytes of heap an idle router
    // without an exporter need not hold (D340).
    Effect.promise(() => import("@effect/opentelemetry/NodeSdk")).pipe(
      Effect.map((NodeSdk) =>
        NodeSdk.layer(() => ({
          resource: { serviceName: "svc-router", serviceVersion: "0.1.0" },
          spanProcessor: processors
        }))
      )
    )
  )

/**
 * Stack capture off for a span: `Effect.withSpan`/`Effect.fn` otherwise take a stack trace (an `Error`)
 * per call, used only to name the span's frame in a failure's pretty print; the span's name says as
 * much, and on a paid request's path the captures cost more than the spans (D320).
 */
export const NO_STACK = { captureStackTrace: false } as const

/**
 * `Effect.withSpan` without a captured stack, and nothing at all where spans are off (no exporter,
 * `References.TracerEnabled` false): even a no-op span provides its parent link and stack frame, two
 * additions to the fiber's context, on every request (D324).
 */
export const traced =
  (name: string, options?: Tracer.SpanOptionsNoTrace) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, Exclude<R, Tracer.ParentSpan>> =>
    Effect.withFiber((fiber) =>
      fiber.getRef(References.TracerEnabled)
        ? Effect.withSpan(self, name, options === undefined ? NO_STACK : { ...options, ...NO_STACK })
        : (self as Effect.Effect<A, E, Exclude<R, Tracer.ParentSpan>>)
    )

/**
 * OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set; otherwise no spans at all
 * (`References.TracerEnabled` off: nobody could read them, and building them, their attributes and
 * their parent links on every request and statement was CPU for nothing, D320).
 */
export const TelemetryLive = Layer.unwrap(
  Effect.gen(function* () {
    const endpoint = yield* Config.String("OTEL_EXPORTER_OTLP_ENDPOINT").pipe(Config.option)
    if (Option.isNone(endpoint)) return Layer.succeed(References.TracerEnabled, false)
    const url = `${endpoint.value.replace(/\/$/, "")}/v1/traces`
    const [{ OTLPTraceExporter }, { BatchSpanProcessor }] = yield* Effect.promise(() =>
      Promise.all([
        import("@opentelemetry/exporter-trace-otlp-http"),
        import("@opentelemetry/sdk-trace-base")
      ])
    )
    return tracingWith([new BatchSpanProcessor(new OTLPTraceExporter({ url }))])
  })
)
