import { NodeHttpClient } from "@effect/platform-node"
import { assert, it as bareIt, layer } from "@effect/vitest"
import { Context, Deferred, Effect, Fiber, Layer, Redacted, Stream } from "effect"
import { HttpClient, HttpClientResponse } from "effect/http"
import {
  ProviderServer,
  type ProviderServerHandle,
  type ProviderServerOptions
} from "../../../src/devnet/fleet/ProviderServer.ts"
import type { ChatCompletionRequest } from "../../../src/domain/Chat.ts"
import type { UpstreamEvent } from "../../../src/inference/Events.ts"
import { make, Upstream, type UpstreamDialect } from "../../../src/inference/upstream/Upstream.ts"
import { ask, capabilityCases, failure, type Run, textOf, toolCallsOf, usageOf } from "./capabilities.ts"

const simOptions = (dialect: UpstreamDialect, overrides: Partial<ProviderServerOptions> = {}) => ({
  providerId: `sim-upstream-${dialect}`,
  dialect,
  modelClasses: ["chat-medium", "grounded-medium"],
  ttftMs: 20,
  tokensPerSecond: 5000,
  maxContext: 100_000,
  ...overrides
})

/** One simulated provider per dialect, started once for the whole file. */
class Sims extends Context.Service<Sims, Readonly<Record<UpstreamDialect, ProviderServerHandle>>>()(
  "test/inference/upstream/Sims"
) {
  static readonly layer = Layer.effect(
    Sims,
    Effect.all({
      openai: ProviderServer.make(simOptions("openai")),
      anthropic: ProviderServer.make(simOptions("anthropic"))
    })
  )
}

const collect = (
  dialect: UpstreamDialect,
  request: ChatCompletionRequest,
  modelClass = "chat-medium",
  maxTokens = 4096
) =>
  Effect.gen(function* () {
    const sims = yield* Sims
    const upstream = yield* Upstream
    const events: Array<UpstreamEvent> = []
    const exit = yield* upstream
      .stream({ baseUrl: sims[dialect].baseUrl, dialect }, request, modelClass, maxTokens)
      .pipe(
        Stream.runForEach((event) => Effect.sync(() => events.push(event))),
        Effect.exit
      )
    return { events, exit } satisfies Run
  })

const dialects: ReadonlyArray<UpstreamDialect> = ["openai", "anthropic"]

// The same capability cases, run against a simulated provider of each dialect.
for (const dialect of dialects) {
  layer(Layer.mergeAll(Sims.layer, Upstream.layerUndici), { excludeTestServices: true })(
    `Upstream against the ${dialect}-dialect simulated provider`,
    (it) => {
      for (const capability of capabilityCases) {
        it.effect(capability.name, () =>
          Effect.map(collect(dialect, capability.request, capability.modelClass), (run) =>
            capability.check(run, dialect)
          )
        )
      }
    }
  )
}

layer(Layer.mergeAll(Sims.layer, Upstream.layerUndici), { excludeTestServices: true })(
  "Upstream: both dialects, translated to the same events",
  (it) => {
    it.effect("the same reply reads the same through either dialect", () =>
      Effect.gen(function* () {
        for (const capability of capabilityCases.filter((c) => c.parity)) {
          const [openai, anthropic] = yield* Effect.all([
            collect("openai", capability.request, capability.modelClass),
            collect("anthropic", capability.request, capability.modelClass)
          ])
          assert.strictEqual(textOf(anthropic.events, "TextDelta"), textOf(openai.events, "TextDelta"))
          assert.strictEqual(
            textOf(anthropic.events, "ReasoningDelta"),
            textOf(openai.events, "ReasoningDelta")
          )
          assert.deepStrictEqual(
            toolCallsOf(anthropic.events).map((c) => [c.name, c.arguments]),
            toolCallsOf(openai.events).map((c) => [c.name, c.arguments])
          )
          const [a, b] = [usageOf(openai.events), usageOf(anthropic.events)]
          assert.strictEqual(b?.inputTokens, a?.inputTokens)
          assert.strictEqual(b?.outputTokens, a?.outputTokens)
          assert.strictEqual(b?.cachedInputTokens, a?.cachedInputTokens)
          const [sourcesA, sourcesB] = [openai.events, anthropic.events].map((events) =>
            events.find((e) => e._tag === "Sources")
          )
          assert.deepStrictEqual(sourcesB, sourcesA)
        }
      })
    )

    it.effect("fails with connect when nothing listens, and with timeout when the first byte is late", () =>
      Effect.gen(function* () {
        const sims = yield* Sims
        const upstream = yield* Upstream
        const refused = yield* upstream
          .stream({ baseUrl: "http://127.0.0.1:1", dialect: "openai" }, ask("hi"), "chat-medium", 64)
          .pipe(Stream.runDrain, Effect.exit)
        assert.strictEqual(failure(refused)?.reason, "connect")

        const impatient = yield* make({ firstByteTimeout: "80 millis" }).pipe(
          Effect.provide(NodeHttpClient.layerUndici)
        )
        for (const dialect of ["openai", "anthropic"] as const) {
          const late = yield* impatient
            .stream({ baseUrl: sims[dialect].baseUrl, dialect }, ask("Hello [[sim:slow]]"), "chat-medium", 64)
            .pipe(Stream.runDrain, Effect.exit)
          assert.strictEqual(failure(late)?.reason, "timeout")
        }
      })
    )
  }
)

layer(Upstream.layerUndici, { excludeTestServices: true })("Upstream interruption", (it) => {
  it.effect("interrupting the consumer aborts the upstream request within a second", () =>
    Effect.gen(function* () {
      const upstream = yield* Upstream
      const interruptMidStream = (dialect: UpstreamDialect) =>
        Effect.gen(function* () {
          const server = yield* ProviderServer.make(simOptions(dialect, { tokensPerSecond: 20 }))
          const firstToken = yield* Deferred.make<void>()
          const fiber = yield* upstream
            .stream({ baseUrl: server.baseUrl, dialect }, ask("Tell a long story."), "chat-medium", 4096)
            .pipe(
              Stream.runForEach((e) =>
                e._tag === "TextDelta" ? Deferred.succeed(firstToken, undefined) : Effect.void
              ),
              Effect.forkChild
            )
          yield* Deferred.await(firstToken)
          yield* Fiber.interrupt(fiber)
          yield* Effect.sleep("250 millis")
          const after = yield* server.counters
          assert.strictEqual(after.streamsAborted, 1)
          assert.strictEqual(after.streamsCompleted, 0)
          yield* Effect.sleep("300 millis")
          assert.strictEqual((yield* server.counters).tokensProduced, after.tokensProduced)
        }).pipe(Effect.scoped)
      // Concurrently, so the two servers' graceful shutdowns overlap.
      yield* Effect.forEach(["openai", "anthropic"] as const, interruptMidStream, { concurrency: 2 })
    })
  )
})

bareIt.effect("sends each dialect's path and credentials, and the class id as the model", () =>
  Effect.gen(function* () {
    const seen: Array<{ url: string; headers: Record<string, string>; body: unknown }> = []
    const wire = {
      openai: 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
      anthropic: 'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    }
    const recording = HttpClient.make((request, url) =>
      Effect.sync(() => {
        const body =
          request.body._tag === "Uint8Array"
            ? JSON.parse(new TextDecoder().decode(request.body.body))
            : undefined
        seen.push({ url: url.toString(), headers: { ...request.headers }, body })
        const dialect = url.pathname === "/v1/messages" ? "anthropic" : "openai"
        return HttpClientResponse.fromWeb(request, new Response(wire[dialect], { status: 200 }))
      })
    )
    const upstream = yield* make().pipe(Effect.provideService(HttpClient.HttpClient, recording))
    const apiKey = Redacted.make("sk-test-key")
    for (const dialect of ["openai", "anthropic"] as const) {
      yield* upstream
        .stream(
          { baseUrl: "https://upstream.test", dialect, apiKey },
          ask("hi", { routing: { task: "x" } }),
          "chat-medium",
          64
        )
        .pipe(Stream.runDrain)
    }
    assert.strictEqual(seen[0]?.url, "https://upstream.test/v1/chat/completions")
    assert.strictEqual(seen[0]?.headers.authorization, "Bearer sk-test-key")
    assert.strictEqual(seen[1]?.url, "https://upstream.test/v1/messages")
    assert.strictEqual(seen[1]?.headers["x-api-key"], "sk-test-key")
    assert.strictEqual(seen[1]?.headers["anthropic-version"], "2023-06-01")
    assert.notProperty(seen[1]?.headers ?? {}, "authorization")
    for (const request of seen) {
      assert.strictEqual((request.body as { model: string }).model, "chat-medium")
      assert.notProperty(request.body, "routing")
    }
  })
)

bareIt.live(
  "holds the first body byte to the timeout, and refuses a JSON answer to a streaming request",
  () =>
    Effect.gen(function* () {
      const silentBody = HttpClient.make((request) =>
        Effect.succeed(
          HttpClientResponse.fromWeb(
            request,
            new Response(new ReadableStream({ start: () => {} }), {
              headers: { "content-type": "text/event-stream" }
            })
          )
        )
      )
      const silent = yield* make({ firstByteTimeout: "60 millis" }).pipe(
        Effect.provideService(HttpClient.HttpClient, silentBody)
      )
      const stalled = yield* silent
        .stream({ baseUrl: "https://upstream.test", dialect: "anthropic" }, ask("hi"), "chat-medium", 64)
        .pipe(Stream.runDrain, Effect.exit)
      assert.strictEqual(failure(stalled)?.reason, "timeout")

      const jsonBody = HttpClient.make((request) =>
        Effect.succeed(
          HttpClientResponse.fromWeb(request, Response.json({ choices: [{ message: { content: "whole" } }] }))
        )
      )
      const buffered = yield* make().pipe(Effect.provideService(HttpClient.HttpClient, jsonBody))
      const answer = yield* buffered
        .stream({ baseUrl: "https://upstream.test", dialect: "openai" }, ask("hi"), "chat-medium", 64)
        .pipe(Stream.runDrain, Effect.exit)
      assert.strictEqual(failure(answer)?.reason, "protocol")
    })
)
