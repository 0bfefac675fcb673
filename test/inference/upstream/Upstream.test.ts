import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse
} from "node:http"
import type { AddressInfo } from "node:net"
import { NodeHttpClient } from "@effect/platform-node"
import { assert, it as bareIt, layer } from "@effect/vitest"
import { Context, Deferred, Effect, Fiber, Layer, Redacted, Stream } from "effect"
import type { Dispatcher } from "undici"
import {
  ProviderServer,
  type ProviderServerHandle,
  type ProviderServerOptions
} from "../../../src/devnet/fleet/ProviderServer.ts"
import type { ChatCompletionRequest } from "../../../src/domain/Chat.ts"
import type { UpstreamEvent } from "../../../src/inference/Events.ts"
import { make, Upstream, type UpstreamDialect } from "../../../src/inference/upstream/Upstream.ts"
import { startStopwatch } from "../../support/Stopwatch.ts"

/** One OpenAI chat-completion chunk as an SSE frame. */
const chunk = (delta: object, finish: string | null) =>
  `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`

/** A handler of each event, for `run`'s events of a read (D565). */
const each =
  (handler: (event: UpstreamEvent) => Effect.Effect<unknown>) => (events: ReadonlyArray<UpstreamEvent>) =>
    Effect.forEach(events, handler, { discard: true })

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
    // `run`, as the router serves: undici's body read directly into the handler.
    const exit = yield* upstream
      .run({ baseUrl: sims[dialect].baseUrl, dialect }, request, modelClass, maxTokens, (batch) =>
        Effect.sync(() => events.push(...batch))
      )
      .pipe(Effect.exit)
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

        const impatient = yield* upstreamWith({ firstByteTimeout: "80 millis" })
        for (const dialect of ["openai", "anthropic"] as const) {
          const target = { baseUrl: sims[dialect].baseUrl, dialect }
          const late = yield* impatient
            .stream(target, ask("Hello [[sim:slow]]"), "chat-medium", 64)
            .pipe(Stream.runDrain, Effect.exit)
          assert.strictEqual(failure(late)?.reason, "timeout")
          const lateRun = yield* impatient
            .run(target, ask("Hello [[sim:slow]]"), "chat-medium", 64, () => Effect.void)
            .pipe(Effect.exit)
          assert.strictEqual(failure(lateRun)?.reason, "timeout")
        }
      }).pipe(Effect.scoped)
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
            .run(
              { baseUrl: server.baseUrl, dialect },
              ask("Tell a long story."),
              "chat-medium",
              4096,
              each((e) => (e._tag === "TextDelta" ? Deferred.succeed(firstToken, undefined) : Effect.void))
            )
            .pipe(Effect.forkChild)
          yield* Deferred.await(firstToken)
          const sinceInterrupt = startStopwatch()
          yield* Fiber.interrupt(fiber)
          // The server learns of the abort when its socket closes, a turn or more later: waited for (a fixed
          // pause was read too early on a loaded machine), within a second stretched by the load.
          let after = yield* server.counters
          for (let i = 0; i < 1_000 && after.streamsAborted === 0; i++) {
            yield* Effect.sleep("10 millis")
            after = yield* server.counters
          }
          assert.strictEqual(after.streamsAborted, 1)
          assert.isBelow(sinceInterrupt.elapsedMs(), 1_000 * sinceInterrupt.stretch())
          assert.strictEqual(after.streamsCompleted, 0)
          yield* Effect.sleep("300 millis")
          assert.strictEqual((yield* server.counters).tokensProduced, after.tokensProduced)
        }).pipe(Effect.scoped)
      // Concurrently, so the two servers' graceful shutdowns overlap. undici emits the torn-down body's
      // abort after `destroy`: with no listener left it is an uncaught exception (a router process ends).
      const uncaught: Array<unknown> = []
      const onUncaught = (error: unknown) => uncaught.push(error)
      process.on("uncaughtException", onUncaught)
      yield* Effect.forEach(["openai", "anthropic"] as const, interruptMidStream, { concurrency: 2 }).pipe(
        Effect.andThen(Effect.sleep("100 millis")),
        Effect.ensuring(Effect.sync(() => process.off("uncaughtException", onUncaught)))
      )
      assert.deepStrictEqual(uncaught.map(String), [])
    })
  )
})

/** A plain HTTP server on a free loopback port, answering with `handle`, closed with the scope. */
const localUpstream = (
  handle: (request: IncomingMessage, body: string, response: ServerResponse) => void,
  setup: (server: Server) => void = () => {}
) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<Server>((resolve) => {
          const server = createServer((request, response) => {
            let body = ""
            request.setEncoding("utf8")
            request.on("data", (piece: string) => {
              body += piece
            })
            request.on("end", () => handle(request, body, response))
          })
          setup(server)
          server.listen(0, "127.0.0.1", () => resolve(server))
        })
    ),
    (server) =>
      Effect.promise(
        () =>
          new Promise<void>((resolve) => {
            server.closeAllConnections()
            server.close(() => resolve())
          })
      )
  ).pipe(Effect.map((server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}`))

/** An upstream client with `options`, on an undici pool that lives as long as the enclosing scope. */
const upstreamWith = (options: Parameters<typeof make>[0] = {}) =>
  Effect.flatMap(Layer.build(NodeHttpClient.layerDispatcher), (context) =>
    make(options).pipe(Effect.provideContext(context))
  )

bareIt.live("sends each dialect's path and credentials, and the class id as the model", () =>
  Effect.gen(function* () {
    const seen: Array<{ url: string; headers: IncomingHttpHeaders; body: unknown }> = []
    const wire = {
      openai: 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
      anthropic: 'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    }
    const baseUrl = yield* localUpstream((request, body, response) => {
      seen.push({ url: request.url ?? "", headers: request.headers, body: JSON.parse(body) })
      response.writeHead(200, { "content-type": "text/event-stream" })
      response.end(wire[request.url === "/v1/messages" ? "anthropic" : "openai"])
    })
    const upstream = yield* upstreamWith()
    const apiKey = Redacted.make("sk-test-key")
    for (const dialect of ["openai", "anthropic"] as const) {
      yield* upstream
        .stream({ baseUrl, dialect, apiKey }, ask("hi", { routing: { task: "x" } }), "chat-medium", 64)
        .pipe(Stream.runDrain)
    }
    assert.strictEqual(seen[0]?.url, "/v1/chat/completions")
    assert.strictEqual(seen[0]?.headers.authorization, "Bearer sk-test-key")
    assert.strictEqual(seen[0]?.headers["content-type"], "application/json")
    assert.strictEqual(seen[1]?.url, "/v1/messages")
    assert.strictEqual(seen[1]?.headers["x-api-key"], "sk-test-key")
    assert.strictEqual(seen[1]?.headers["anthropic-version"], "2023-06-01")
    assert.notProperty(seen[1]?.headers ?? {}, "authorization")
    for (const request of seen) {
      assert.strictEqual((request.body as { model: string }).model, "chat-medium")
      assert.notProperty(request.body, "routing")
    }
  }).pipe(Effect.scoped)
)

bareIt.live(
  "holds the head and then the first body byte to the timeout, and refuses a JSON answer to a streaming request",
  () =>
    Effect.gen(function* () {
      const held: Array<ServerResponse> = []
      // A head and then nothing (Messages); a whole JSON document (chat completions).
      const baseUrl = yield* localUpstream((request, _body, response) => {
        held.push(response)
        if (request.url === "/v1/messages") {
          response.writeHead(200, { "content-type": "text/event-stream" })
          response.flushHeaders()
        } else {
          response.writeHead(200, { "content-type": "application/json" })
          response.end(JSON.stringify({ choices: [{ message: { content: "whole" } }] }))
        }
      })
      // No head at all.
      const headless = yield* localUpstream((_request, _body, response) => {
        held.push(response)
      })
      const silent = yield* upstreamWith({ firstByteTimeout: "60 millis" })
      const stalled = yield* silent
        .stream({ baseUrl, dialect: "anthropic" }, ask("hi"), "chat-medium", 64)
        .pipe(Stream.runDrain, Effect.exit)
      assert.strictEqual(failure(stalled)?.reason, "timeout")
      const stalledRun = yield* silent
        .run({ baseUrl, dialect: "anthropic" }, ask("hi"), "chat-medium", 64, () => Effect.void)
        .pipe(Effect.exit)
      assert.strictEqual(failure(stalledRun)?.reason, "timeout")
      const noHead = yield* silent
        .stream({ baseUrl: headless, dialect: "openai" }, ask("hi"), "chat-medium", 64)
        .pipe(Stream.runDrain, Effect.exit)
      assert.strictEqual(failure(noHead)?.reason, "timeout")

      const buffered = yield* upstreamWith()
      const answer = yield* buffered
        .stream({ baseUrl, dialect: "openai" }, ask("hi"), "chat-medium", 64)
        .pipe(Stream.runDrain, Effect.exit)
      assert.strictEqual(failure(answer)?.reason, "protocol")
      for (const response of held) response.destroy()
    }).pipe(Effect.scoped)
)

bareIt.live(
  "a reply read to its terminal frame lets its body end on its own: no abort for a finished response",
  () =>
    Effect.gen(function* () {
      // The frames and the body's end in one write, as a provider ending its reply sends them.
      const baseUrl = yield* localUpstream((_request, _body, response) => {
        response.writeHead(200, { "content-type": "text/event-stream" })
        const chunk = (delta: object, finish: string | null) =>
          `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`
        response.end(`${chunk({ content: "done" }, null)}${chunk({}, "stop")}data: [DONE]\n\n`)
      })
      // What undici tells each call's handler, as the router's dispatcher runs it.
      const calls: Array<{ ended: boolean; errored: boolean }> = []
      const dispatcher = yield* Layer.build(NodeHttpClient.layerDispatcher).pipe(
        Effect.map((context) => Context.get(context, NodeHttpClient.Dispatcher))
      )
      const spying = {
        dispatch: (options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler) => {
          const seen = { ended: false, errored: false }
          calls.push(seen)
          return dispatcher.dispatch(options, {
            onRequestStart: (controller, context) => handler.onRequestStart?.(controller, context),
            onResponseStart: (controller, status, headers, message) =>
              handler.onResponseStart?.(controller, status, headers, message),
            onResponseData: (controller, chunk) => handler.onResponseData?.(controller, chunk),
            onResponseEnd: (controller, trailers) => {
              seen.ended = true
              handler.onResponseEnd?.(controller, trailers)
            },
            onResponseError: (controller, error) => {
              seen.errored = true
              handler.onResponseError?.(controller, error)
            }
          })
        }
      } as unknown as typeof dispatcher
      const upstream = yield* make().pipe(Effect.provideService(NodeHttpClient.Dispatcher, spying))
      for (let i = 0; i < 3; i++) {
        const texts: Array<string> = []
        yield* upstream.run(
          { baseUrl, dialect: "openai" },
          ask("hi"),
          "chat-medium",
          64,
          each((event) =>
            Effect.sync(() => {
              if (event._tag === "TextDelta") texts.push(event.text)
            })
          )
        )
        assert.deepStrictEqual(texts, ["done"])
      }
      yield* Effect.sleep("50 millis")
      // Aborted before its end, a finished response's connection is closed and undici makes an abort
      // error for it (D470): each call ends on its own.
      assert.deepStrictEqual(calls, [
        { ended: true, errored: false },
        { ended: true, errored: false },
        { ended: true, errored: false }
      ])
    }).pipe(Effect.scoped)
)

bareIt.live(
  "an idle upstream connection is closed after the router's bound, whatever the server's keep-alive hint (D505)",
  () =>
    Effect.gen(function* () {
      // A server that hints a minute of keep-alive (`Keep-Alive: timeout=60`), counting its open sockets.
      const open = new Set<unknown>()
      const baseUrl = yield* localUpstream(
        (_request, _body, response) => {
          response.writeHead(200, { "content-type": "text/event-stream" })
          response.end(
            'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
          )
        },
        (server) => {
          server.keepAliveTimeout = 60_000
          server.on("connection", (socket) => {
            open.add(socket)
            socket.on("close", () => open.delete(socket))
          })
        }
      )
      const callThrough = (idleMaxMs: number) =>
        Effect.gen(function* () {
          const context = yield* Layer.build(Upstream.layerUndiciWith(idleMaxMs))
          const upstream = Context.get(context, Upstream)
          yield* upstream
            .stream({ baseUrl, dialect: "openai" }, ask("hi"), "chat-medium", 64)
            .pipe(Stream.runDrain)
        })
      // Bounded at 300 ms: the connection is kept after the call, then closed well before the hint's minute.
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* callThrough(300)
          assert.strictEqual(open.size, 1, "the connection is kept alive after the call")
          yield* Effect.sleep("1500 millis")
          assert.strictEqual(open.size, 0, "the idle connection was closed at the router's bound")
        })
      )
      // Bounded at 30 s: the same wait leaves it open (the hint, not undici's 4 s default, is what is capped).
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* callThrough(30_000)
          yield* Effect.sleep("1500 millis")
          assert.strictEqual(open.size, 1, "kept while within the bound")
        })
      )
    }).pipe(Effect.scoped)
)

bareIt.live(
  "a provider's error quoting the prompt is redacted, in its answer's body and in an error frame mid-reply",
  () =>
    Effect.gen(function* () {
      const prompt = "The launch code is PURPLE-OTTER-4417, keep it."
      const chunk = (content: string) =>
        `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`
      const baseUrl = yield* localUpstream((_request, body, response) => {
        const sent = JSON.parse(body) as { model: string; messages: Array<{ content: string }> }
        const text = sent.messages[1]!.content
        if (sent.model === "refused") {
          response.writeHead(400, { "content-type": "application/json" })
          response.end(JSON.stringify({ error: { type: "invalid_request", message: `bad input: ${text}` } }))
          return
        }
        // A token, then an error frame that quotes the prompt: the reply is held open until then.
        response.writeHead(200, { "content-type": "text/event-stream" })
        response.write(chunk("Hel"))
        setTimeout(
          () =>
            response.end(
              `data: ${JSON.stringify({ error: { type: "server_error", message: `failed on ${text}` } })}\n\n`
            ),
          50
        )
      })
      const upstream = yield* upstreamWith()
      const target = { baseUrl, dialect: "openai" } as const
      const texts: Array<string> = []
      const midReply = yield* upstream
        .run(
          target,
          ask(prompt),
          "chat-medium",
          64,
          each((event) =>
            Effect.sync(() => {
              if (event._tag === "TextDelta") texts.push(event.text)
            })
          )
        )
        .pipe(Effect.exit)
      assert.deepStrictEqual(texts, ["Hel"])
      const frame = failure(midReply)
      assert.strictEqual(frame?.reason, "provider_error")
      assert.include(frame?.excerpt ?? "", "failed on [redacted]")
      assert.notInclude(frame?.excerpt ?? "", "OTTER")

      const refused = yield* upstream
        .run(target, ask(prompt), "refused", 64, () => Effect.void)
        .pipe(Effect.exit)
      const answered = failure(refused)
      assert.strictEqual(answered?.reason, "http_status")
      assert.include(answered?.excerpt ?? "", "bad input: [redacted]")
      assert.notInclude(answered?.excerpt ?? "", "OTTER")
    }).pipe(Effect.scoped)
)

bareIt.live(
  "a reader slower than its provider gets every piece: the call is paused ahead of it and resumed",
  () =>
    Effect.gen(function* () {
      const baseUrl = yield* localUpstream((_request, _body, response) => {
        response.writeHead(200, { "content-type": "text/event-stream" })
        // Each piece in a write of its own, a turn of the event loop apart: far more than the reader takes.
        let sent = 0
        const next = () => {
          if (sent === 300) return response.end(`${chunk({}, "stop")}data: [DONE]\n\n`)
          response.write(chunk({ content: `${sent++} ` }, null))
          setImmediate(next)
        }
        next()
      })
      const upstream = yield* upstreamWith()
      const texts: Array<string> = []
      yield* upstream.run(
        { baseUrl, dialect: "openai" },
        ask("count"),
        "chat-medium",
        4096,
        each((event) =>
          event._tag === "TextDelta"
            ? Effect.andThen(
                Effect.sync(() => texts.push(event.text)),
                texts.length < 20 ? Effect.sleep("5 millis") : Effect.void
              )
            : Effect.void
        )
      )
      assert.strictEqual(texts.join(""), Array.from({ length: 300 }, (_, i) => `${i} `).join(""))
    }).pipe(Effect.scoped)
)

bareIt.live(
  "a reply that arrives at once is handed over in a call per read, every event in order (D565)",
  () =>
    Effect.gen(function* () {
      const baseUrl = yield* localUpstream((_request, _body, response) => {
        response.writeHead(200, { "content-type": "text/event-stream" })
        // 200 pieces, the finish and the end in one write: a reply a provider had ready.
        const pieces = Array.from({ length: 200 }, (_, i) => chunk({ content: `${i} ` }, null)).join("")
        response.end(`${pieces}${chunk({}, "stop")}data: [DONE]\n\n`)
      })
      const upstream = yield* upstreamWith()
      const calls: Array<ReadonlyArray<UpstreamEvent>> = []
      yield* upstream.run({ baseUrl, dialect: "openai" }, ask("count"), "chat-medium", 4096, (events) =>
        Effect.sync(() => {
          calls.push(events)
        })
      )
      const events = calls.flat()
      const texts = events.flatMap((e) => (e._tag === "TextDelta" ? [e.text] : []))
      assert.strictEqual(texts.join(""), Array.from({ length: 200 }, (_, i) => `${i} `).join(""))
      assert.deepStrictEqual(
        events.filter((e) => e._tag === "Finish").map((e) => (e as { reason: string }).reason),
        ["stop"]
      )
      // A 10 KB write comes in a read or a few, not a call per event.
      assert.isTrue(calls.every((batch) => batch.length > 0))
      assert.isAtMost(calls.length, 10, `${calls.length} calls for ${events.length} events`)
    }).pipe(Effect.scoped)
)
