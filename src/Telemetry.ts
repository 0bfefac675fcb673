import * as NodeSdk from "@effect/opentelemetry/NodeSdk"
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http"
import { BatchSpanProcessor, type SpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Config, Effect, Layer, Option } from "effect"

/**
 * Tracing. Span attributes carry ids, classes, winners and prices; never a prompt, a
 * reply, a credit key, a private key or a payment envelope.
 */
export const tracingWith = (processors: ReadonlyArray<SpanProcessor>) =>
  NodeSdk.layer(() => ({
    resource: { serviceName: "svc-router", serviceVersion: "0.1.0" },
    spanProcessor: processors
  }))

/** OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set; otherwise spans stay in-process. */
export const TelemetryLive = Layer.unwrap(
  Effect.gen(function* () {
    const endpoint = yield* Config.String("OTEL_EXPORTER_OTLP_ENDPOINT").pipe(Config.option)
    if (Option.isNone(endpoint)) return Layer.empty
    const url = `${endpoint.value.replace(/\/$/, "")}/v1/traces`
    return tracingWith([new BatchSpanProcessor(new OTLPTraceExporter({ url }))])
  })
)
