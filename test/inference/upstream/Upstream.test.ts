import { assert, it as bareIt, layer } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Redacted, Stream } from "effect"
import { FetchHttpClient, HttpClient, HttpClientResponse } from "effect/http"
import {
  ProviderServer,
  type ProviderServerHandle,
  type ProviderServerOptions
} from "../../../src/devnet/fleet/ProviderServer.ts"
import type { ChatCompletionRequest, FunctionTool } from "../../../src/domain/Chat.ts"
import type { UpstreamEvent } from "../../../src/inference/Events.ts"
import { make, Upstream, type UpstreamDialect } from "../../../src/inference/upstream/Upstream.ts"
import type { UpstreamError } from "../../../src/inference/upstream/UpstreamError.ts"

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

interface Run {
  readonly events: ReadonlyArray<UpstreamEvent>
  readonly exit: Exit.Exit<void, UpstreamError>
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

const both = (request: ChatCompletionRequest, modelClass?: string) =>
  Effect.all([collect("openai", request, modelClass), collect("anthropic", request, modelClass)])

/** Event kinds with runs of one kind collapsed: the shape of a reply. */
const kinds = (events: ReadonlyArray<UpstreamEvent>) =>
  events.map((e) => e._tag).filter((tag, i, all) => i === 0 || all[i - 1] !== tag)
const textOf = (events: ReadonlyArray<UpstreamEvent>, tag: "TextDelta" | "ReasoningDelta") =>
  events.map((e) => (e._tag === tag ? e.text : "")).join("")
const usageOf = (events: ReadonlyArray<UpstreamEvent>) => {
  const usage = events.findLast((e) => e._tag === "Usage")
  assert.isDefined(usage)
  return usage?._tag === "Usage" ? usage : undefined
}
const toolCallsOf = (events: ReadonlyArray<UpstreamEvent>) => {
  const calls: Array<{ id: string; name: string; arguments: string; pieces: number }> = []
  for (const e of events) {
    if (e._tag !== "ToolCallDelta") continue
    calls[e.index] ??= { id: e.id ?? "", name: e.name ?? "", arguments: "", pieces: 0 }
    const call = calls[e.index]!
    call.arguments += e.argumentsDelta
    if (e.argumentsDelta.length > 0) call.pieces++
  }
  return calls
}
/** Completion tokens as the simulated providers count them: one per streamed piece. */
const tokenPieces = (events: ReadonlyArray<UpstreamEvent>) =>
  events.filter(
    (e) =>
      e._tag === "TextDelta" ||
      e._tag === "ReasoningDelta" ||
      (e._tag === "ToolCallDelta" && e.argumentsDelta !== "")
  ).length

const failure = (exit: Exit.Exit<void, UpstreamError>) => {
  assert.isTrue(Exit.isFailure(exit), "the stream should fail")
  return Exit.isFailure(exit) ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error : undefined
}

const ask = (content: string, extra: Partial<ChatCompletionRequest> = {}): ChatCompletionRequest => ({
  model: "auto",
  messages: [
    { role: "system", content: "You are terse." },
    { role: "user", content }
  ],
  ...extra
})

const tools: ReadonlyArray<typeof FunctionTool.Type> = [
  {
    type: "function",
    function: {
      name: "get_quote",
      parameters: {
        type: "object",
        properties: { symbol: { type: "string" }, size: { type: "integer" } },
        required: ["symbol", "size"]
      }
    }
  },
  {
    type: "function",
    function: {
      name: "cancel_order",
      parameters: { type: "object", properties: { id: { type: "string" } }, required: ["id"] }
    }
  },
  {
    type: "function",
    function: {
      name: "list_fills",
      parameters: {
        type: "object",
        properties: { since: { type: "string" }, limit: { type: "integer" } },
        required: ["since", "limit"]
      }
    }
  }
]

layer(Layer.mergeAll(Sims.layer, Upstream.layerFetch), { excludeTestServices: true })(
  "Upstream against simulated providers of both dialects",
  (it) => {
    it.effect("streams text with usage, the same through either dialect", () =>
      Effect.gen(function* () {
        const [openai, anthropic] = yield* both(ask("Explain a second-score auction."))
        for (const run of [openai, anthropic]) {
          assert.isTrue(Exit.isSuccess(run.exit))
          assert.deepStrictEqual(kinds(run.events), ["TextDelta", "Finish", "Usage"])
          assert.deepStrictEqual(
            run.events.find((e) => e._tag === "Finish"),
            { _tag: "Finish", reason: "stop" }
          )
          assert.isAbove(run.events.filter((e) => e._tag === "TextDelta").length, 5)
          assert.strictEqual(usageOf(run.events)?.outputTokens, tokenPieces(run.events))
        }
        assert.strictEqual(textOf(anthropic.events, "TextDelta"), textOf(openai.events, "TextDelta"))
        const [a, b] = [usageOf(openai.events), usageOf(anthropic.events)]
        assert.isAbove(a?.inputTokens ?? 0, 0)
        assert.strictEqual(b?.inputTokens, a?.inputTokens)
        assert.strictEqual(b?.outputTokens, a?.outputTokens)
        assert.strictEqual(b?.cachedInputTokens, a?.cachedInputTokens)
      })
    )

    it.effect("streams reasoning before the answer, the same through either dialect", () =>
      Effect.gen(function* () {
        const [openai, anthropic] = yield* both(ask("Think, then answer.", { reasoning_effort: "high" }))
        for (const run of [openai, anthropic]) {
          assert.isTrue(Exit.isSuccess(run.exit))
          assert.deepStrictEqual(kinds(run.events), ["ReasoningDelta", "TextDelta", "Finish", "Usage"])
          assert.strictEqual(usageOf(run.events)?.outputTokens, tokenPieces(run.events))
        }
        assert.isAbove(textOf(openai.events, "ReasoningDelta").length, 0)
        assert.strictEqual(
          textOf(anthropic.events, "ReasoningDelta"),
          textOf(openai.events, "ReasoningDelta")
        )
        assert.strictEqual(textOf(anthropic.events, "TextDelta"), textOf(openai.events, "TextDelta"))
        // The chat dialect counts reasoning; the Messages dialect does not say (the caller estimates).
        assert.strictEqual(
          usageOf(openai.events)?.reasoningTokens,
          openai.events.filter((e) => e._tag === "ReasoningDelta").length
        )
        assert.isUndefined(usageOf(anthropic.events)?.reasoningTokens)
        assert.strictEqual(usageOf(anthropic.events)?.outputTokens, usageOf(openai.events)?.outputTokens)
      })
    )

    it.effect("streams several tool calls with arguments in pieces, the same through either dialect", () =>
      Effect.gen(function* () {
        const [openai, anthropic] = yield* both(ask("Check the book. [[sim:multi-tool]]", { tools }))
        const calls = [toolCallsOf(openai.events), toolCallsOf(anthropic.events)] as const
        for (const run of [openai, anthropic]) {
          assert.isTrue(Exit.isSuccess(run.exit))
          assert.deepStrictEqual(kinds(run.events), ["ToolCallDelta", "Finish", "Usage"])
          assert.deepStrictEqual(
            run.events.find((e) => e._tag === "Finish"),
            { _tag: "Finish", reason: "tool_calls" }
          )
          assert.strictEqual(usageOf(run.events)?.outputTokens, tokenPieces(run.events))
        }
        for (const list of calls) {
          assert.deepStrictEqual(
            list.map((c) => c.name),
            ["get_quote", "cancel_order", "list_fills"]
          )
          for (const call of list) {
            assert.isAbove(call.pieces, 1)
            assert.isObject(JSON.parse(call.arguments))
          }
        }
        assert.isTrue(calls[0].every((c) => c.id.startsWith("call_")))
        assert.isTrue(calls[1].every((c) => c.id.startsWith("toolu_")))
        assert.deepStrictEqual(
          calls[1].map((c) => c.arguments),
          calls[0].map((c) => c.arguments)
        )
        assert.hasAllKeys(JSON.parse(calls[0][0]!.arguments), ["symbol", "size"])
      })
    )

    it.effect("feeds tool results back and gets a text answer through either dialect", () =>
      Effect.gen(function* () {
        const request = ask("Quote ACME.", { tools })
        const [first] = yield* both(request)
        const call = toolCallsOf(first.events)[0]!
        const followUp: ChatCompletionRequest = {
          ...request,
          messages: [
            ...request.messages,
            {
              role: "assistant",
              content: null,
              tool_calls: [
                { id: call.id, type: "function", function: { name: call.name, arguments: call.arguments } }
              ]
            },
            { role: "tool", tool_call_id: call.id, content: '{"price": 101}' }
          ]
        }
        const [openai, anthropic] = yield* both(followUp)
        for (const run of [openai, anthropic]) {
          assert.isTrue(Exit.isSuccess(run.exit))
          assert.deepStrictEqual(kinds(run.events), ["TextDelta", "Finish", "Usage"])
        }
      })
    )

    it.effect("streams JSON that follows the response format's schema", () =>
      Effect.gen(function* () {
        const schema = {
          type: "object",
          properties: { city: { type: "string" }, population: { type: "integer" } },
          required: ["city", "population"]
        }
        const [openai, anthropic] = yield* both(
          ask("A city, as JSON.", {
            response_format: { type: "json_schema", json_schema: { name: "city", schema } }
          })
        )
        for (const run of [openai, anthropic]) {
          assert.isTrue(Exit.isSuccess(run.exit))
          assert.hasAllKeys(JSON.parse(textOf(run.events, "TextDelta")), ["city", "population"])
        }
        assert.strictEqual(textOf(anthropic.events, "TextDelta"), textOf(openai.events, "TextDelta"))
      })
    )

    it.effect("reports grounded sources first, the same through either dialect", () =>
      Effect.gen(function* () {
        const [openai, anthropic] = yield* both(ask("What happened in the market?"), "grounded-medium")
        for (const run of [openai, anthropic]) {
          assert.isTrue(Exit.isSuccess(run.exit))
          assert.deepStrictEqual(kinds(run.events), ["Sources", "TextDelta", "Finish", "Usage"])
          const sources = run.events[0]
          assert.isTrue(sources?._tag === "Sources" && sources.sources.length === 3)
          assert.include(textOf(run.events, "TextDelta"), "[1]")
        }
        assert.deepStrictEqual(anthropic.events[0], openai.events[0])
      })
    )

    it.effect("[[sim:error]] fails with http_status before any event", () =>
      Effect.gen(function* () {
        for (const run of yield* both(ask("Hello [[sim:error]]"))) {
          assert.deepStrictEqual(run.events, [])
          const error = failure(run.exit)
          assert.strictEqual(error?.reason, "http_status")
          assert.strictEqual(error?.status, 500)
          assert.include(error?.excerpt ?? "", "simulated upstream failure")
        }
      })
    )

    it.effect("[[sim:drop]] delivers a few tokens, then fails with dropped", () =>
      Effect.gen(function* () {
        for (const run of yield* both(ask("Hello [[sim:drop]]"))) {
          const texts = run.events.filter((e) => e._tag === "TextDelta")
          assert.isAtLeast(texts.length, 1)
          assert.isAtMost(texts.length, 3)
          assert.isFalse(run.events.some((e) => e._tag === "Finish"))
          assert.strictEqual(failure(run.exit)?.reason, "dropped")
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
          Effect.provide(FetchHttpClient.layer)
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

layer(Upstream.layerFetch, { excludeTestServices: true })("Upstream interruption", (it) => {
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
