import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { call, OPERATOR_TOKEN, postJson, routerLayer } from "../support/Router.ts"

type OpenAiError = { error: { message: string; type: string; code: string | null; param: string | null } }
type AnthropicError = { type: "error"; error: { type: string; message: string } }

describe("foundation HTTP surface", () => {
  layer(routerLayer(), { timeout: 120_000, excludeTestServices: true })((it) => {
    it.effect("GET /health names the network, the auction version and the router signer", () =>
      Effect.gen(function* () {
        const r = yield* call("/health")
        assert.strictEqual(r.status, 200)
        assert.deepInclude(r.json as object, {
          status: "ok",
          network: "eip155:31337",
          auction_version: "second-score/1"
        })
        assert.match((r.json as { router_signer: string }).router_signer, /^0x[0-9a-fA-F]{40}$/)
        assert.strictEqual(r.headers.get("x-svc-auction-version"), "second-score/1")
      })
    )

    it.effect("GET /ready reports database, chain and reconciliation state", () =>
      Effect.gen(function* () {
        const r = yield* call("/ready")
        assert.strictEqual(r.status, 200)
        const body = r.json as {
          status: string
          database: { status: string }
          chain: { status: string }
          reconciliation: { status: string }
        }
        assert.strictEqual(body.status, "ready")
        assert.strictEqual(body.database.status, "up")
        assert.strictEqual(body.chain.status, "up")
        assert.strictEqual(body.reconciliation.status, "not_run")
      })
    )

    it.effect(
      "GET /metrics is Prometheus text with request counts, latency histograms and reconciliation gauges",
      () =>
        Effect.gen(function* () {
          yield* call("/health")
          const r = yield* call("/metrics")
          assert.strictEqual(r.status, 200)
          assert.match(r.headers.get("content-type") ?? "", /^text\/plain/)
          assert.match(r.text, /http_requests_total\{[^}]*route="\/health"[^}]*status="200"[^}]*\} \d+/)
          assert.match(r.text, /http_request_duration_seconds_bucket\{[^}]*route="\/health"/)
          assert.match(r.text, /^svc_reconciliation_ok(\{[^}]*\})? 0$/m)
          assert.match(r.text, /^svc_reconciliation_last_run_timestamp_seconds(\{[^}]*\})? 0$/m)
        })
    )

    it.effect("GET /openapi.json documents the API", () =>
      Effect.gen(function* () {
        const r = yield* call("/openapi.json")
        assert.strictEqual(r.status, 200)
        const doc = r.json as { openapi: string; paths: Record<string, unknown> }
        assert.match(doc.openapi, /^3\./)
        for (const path of [
          "/health",
          "/ready",
          "/metrics",
          "/v1/embeddings",
          "/provider/quotes",
          "/v1/market/book"
        ]) {
          assert.property(doc.paths, path)
        }
      })
    )

    it.effect("gated features answer feature_gated (403) before any payment", () =>
      Effect.gen(function* () {
        const cases = [
          yield* postJson("/v1/embeddings", { model: "auto", input: "x" }),
          yield* call("/v1/context/passports/p1"),
          yield* call("/v1/context/passports/p1", { method: "DELETE" }),
          yield* postJson("/v1/orders", { model: "auto" })
        ]
        for (const r of cases) {
          assert.strictEqual(r.status, 403)
          assert.strictEqual((r.json as OpenAiError).error.code, "feature_gated")
          assert.isNull(r.headers.get("payment-required"))
        }
      })
    )

    it.effect("malformed input is a 400 in OpenAI's convention; unknown routes 404", () =>
      Effect.gen(function* () {
        const badJson = yield* call("/v1/routing/preview", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: "{not json"
        })
        assert.strictEqual(badJson.status, 400)
        assert.strictEqual((badJson.json as OpenAiError).error.type, "invalid_request_error")
        const badShape = yield* postJson("/v1/routing/preview", { model: 7, messages: [] })
        assert.strictEqual(badShape.status, 400)
        assert.match((badShape.json as OpenAiError).error.message, /model/)
        const missing = yield* call("/v1/does-not-exist")
        assert.strictEqual(missing.status, 404)
        assert.strictEqual((missing.json as OpenAiError).error.type, "not_found_error")
      })
    )

    it.effect("errors under /v1/messages use Anthropic's convention", () =>
      Effect.gen(function* () {
        const r = yield* call("/v1/messages/unknown-subpath", { method: "POST", body: "{}" })
        assert.strictEqual(r.status, 404)
        const body = r.json as AnthropicError
        assert.strictEqual(body.type, "error")
        assert.strictEqual(body.error.type, "not_found_error")
      })
    )

    it.effect("an oversized body is a 413", () =>
      Effect.gen(function* () {
        const huge = "x".repeat(5 * 1024 * 1024)
        const r = yield* postJson("/v1/routing/preview", {
          model: "auto",
          messages: [{ role: "user", content: huge }]
        })
        assert.strictEqual(r.status, 413)
        assert.strictEqual((r.json as OpenAiError).error.code, "payload_too_large")
      })
    )

    it.effect("a body that is not JSON is a 415 rendered as a JSON error in the caller's dialect", () =>
      Effect.gen(function* () {
        const post = (path: string, contentType: string) =>
          call(path, { method: "POST", headers: { "content-type": contentType }, body: "model=auto" })
        for (const path of ["/v1/chat/completions", "/v1/responses", "/v1/images/generations"]) {
          const r = yield* post(path, "application/x-www-form-urlencoded")
          assert.strictEqual(r.status, 415, path)
          assert.match(r.headers.get("content-type") ?? "", /application\/json/)
          const body = r.json as OpenAiError
          assert.strictEqual(body.error.code, "unsupported_media_type")
          assert.strictEqual(body.error.type, "invalid_request_error")
        }
        const messages = yield* post("/v1/messages", "text/plain")
        assert.strictEqual(messages.status, 415)
        const body = messages.json as AnthropicError
        assert.strictEqual(body.type, "error")
        assert.strictEqual(body.error.type, "invalid_request_error")
      })
    )

    it.effect("the admin surface never answers without the operator token", () =>
      Effect.gen(function* () {
        const none = yield* call("/v1/admin/providers")
        assert.strictEqual(none.status, 401)
        const wrong = yield* call("/v1/admin/providers", { headers: { authorization: "Bearer nope" } })
        assert.strictEqual(wrong.status, 401)
        const right = yield* call("/v1/admin/providers", {
          headers: { authorization: `Bearer ${OPERATOR_TOKEN}` }
        })
        assert.strictEqual(right.status, 200)
      })
    )
  })
})
