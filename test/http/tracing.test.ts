import { assert, describe, it, layer } from "@effect/vitest"
import { SpanKind } from "@opentelemetry/api"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { ConfigProvider, Effect, Layer, References } from "effect"
import { TelemetryLive, traced, tracingWith } from "../../src/Telemetry.ts"
import { call, OPERATOR_TOKEN, routerLayer } from "../support/Router.ts"

const exporter = new InMemorySpanExporter()

/** Whether spans are recorded under `npm start`'s telemetry, with the environment given. */
const tracerEnabledWith = (env: Record<string, string>) =>
  Effect.gen(function* () {
    return yield* References.TracerEnabled
  }).pipe(
    Effect.provide(
      TelemetryLive.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord(env))))
    ),
    Effect.scoped
  )

describe("telemetry without an exporter", () => {
  // D320: with nowhere to send them, no span is made (nor its attributes, links and context copies).
  it.effect("records no spans unless OTEL_EXPORTER_OTLP_ENDPOINT is set", () =>
    Effect.gen(function* () {
      assert.isFalse(yield* tracerEnabledWith({}))
      assert.isTrue(yield* tracerEnabledWith({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:19599" }))
    })
  )

  // D324: `traced` is the span where spans are on, and adds nothing (not even a no-op span) where off.
  it.effect("traced opens its span only where spans are on", () =>
    Effect.gen(function* () {
      const inside = Effect.currentSpan.pipe(
        Effect.map((span) => span.name),
        Effect.orElseSucceed(() => "none"),
        traced("Hotpath.probe")
      )
      assert.strictEqual(yield* inside, "Hotpath.probe")
      assert.strictEqual(yield* Effect.provideService(inside, References.TracerEnabled, false), "none")
    })
  )
})

/**
 * The finished spans once the request's server span has ended: it ends after the reply is written, so
 * the client can read the reply before it (a fixed 50 ms pause was sometimes too short on a loaded machine).
 */
const serverSpanEnded = Effect.gen(function* () {
  for (let i = 0; i < 500; i++) {
    const spans = exporter.getFinishedSpans()
    if (spans.some((s) => s.kind === SpanKind.SERVER)) return spans
    yield* Effect.sleep("20 millis")
  }
  return exporter.getFinishedSpans()
})

describe("tracing", () => {
  layer(routerLayer().pipe(Layer.provide(tracingWith([new SimpleSpanProcessor(exporter)]))), {
    excludeTestServices: true,
    timeout: 120_000
  })((it) => {
    it.effect("one request is one trace: a server span with the service-call spans under it", () =>
      Effect.gen(function* () {
        exporter.reset()
        const r = yield* call("/ready")
        assert.strictEqual(r.status, 200)
        const spans = yield* serverSpanEnded
        const server = spans.find((s) => s.kind === SpanKind.SERVER && s.name === "GET")
        assert.isDefined(server, `spans: ${spans.map((s) => s.name).join(", ")}`)
        const check = spans.find((s) => s.name === "Readiness.check")
        assert.isDefined(check)
        assert.strictEqual(check!.spanContext().traceId, server!.spanContext().traceId)
        assert.strictEqual(
          server!.attributes["http.response.status_code"] ?? server!.attributes["http.status_code"],
          200
        )
      })
    )

    it.effect("no secret appears in any span attribute", () =>
      Effect.gen(function* () {
        exporter.reset()
        yield* call("/v1/admin/providers", { headers: { authorization: `Bearer ${OPERATOR_TOKEN}` } })
        const spans = yield* serverSpanEnded
        assert.isAbove(spans.length, 0)
        const dump = JSON.stringify(
          spans.map((s) => ({ name: s.name, attributes: s.attributes, events: s.events }))
        )
        assert.notInclude(dump, OPERATOR_TOKEN)
      })
    )
  })
})
