import Anthropic from "@anthropic-ai/sdk"
import { assert, layer } from "@effect/vitest"
import { Effect } from "effect"
import { ProviderServer } from "../../src/devnet/fleet/ProviderServer.ts"
import {
  type AnthropicErrorBody,
  events,
  fastOptions,
  postAndRead,
  postJson,
  readJson,
  type WithSources
} from "./sse.ts"

const client = (baseUrl: string) => new Anthropic({ baseURL: baseUrl, apiKey: "sim", maxRetries: 0 })

const base = {
  model: "chat-large",
  max_tokens: 1024,
  system: "You are terse.",
  messages: [{ role: "user" as const, content: "Explain a second-score auction." }]
}

const tools = [
  {
    name: "get_quote",
    input_schema: {
      type: "object" as const,
      properties: { symbol: { type: "string" }, size: { type: "integer" } },
      required: ["symbol", "size"]
    }
  },
  {
    name: "cancel",
    input_schema: { type: "object" as const, properties: { id: { type: "string" } }, required: ["id"] }
  }
]

const options = fastOptions({
  providerId: "sim-test-anthropic",
  dialect: "anthropic",
  modelClasses: ["chat-large", "grounded-medium"]
})

layer(ProviderServer.layer(options), { excludeTestServices: true })("anthropic dialect", (it) => {
  it.effect("answers a Messages object with usage in input_tokens / output_tokens", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const message = yield* Effect.promise(() => client(server.baseUrl).messages.create(base))
      assert.strictEqual(message.type, "message")
      assert.strictEqual(message.role, "assistant")
      assert.strictEqual(message.stop_reason, "end_turn")
      const block = message.content[0]!
      assert.isTrue(block.type === "text" && block.text.length > 0)
      assert.isAbove(message.usage.input_tokens, 0)
      assert.isAbove(message.usage.output_tokens, 0)
    })
  )

  it.effect("streams events in the Messages order and the SDK reassembles the same message", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const whole = yield* Effect.promise(() => client(server.baseUrl).messages.create(base))
      const raw = yield* postAndRead(`${server.baseUrl}/v1/messages`, { ...base, stream: true })
      const evs = events(raw.text)
      for (const e of evs) assert.strictEqual(e.event, e.data.type)
      const names = evs.map((e) => e.event)
      assert.deepStrictEqual(names.slice(0, 2), ["message_start", "content_block_start"])
      assert.deepStrictEqual(names.slice(-3), ["content_block_stop", "message_delta", "message_stop"])
      assert.isTrue(names.slice(2, -3).every((n) => n === "content_block_delta"))
      const delta = evs.at(-2)!.data as unknown as {
        usage: { output_tokens: number }
        delta: { stop_reason: string }
      }
      assert.strictEqual(delta.usage.output_tokens, whole.usage.output_tokens)
      assert.strictEqual(delta.delta.stop_reason, "end_turn")

      const final = yield* Effect.promise(() => client(server.baseUrl).messages.stream(base).finalMessage())
      assert.deepStrictEqual(final.content, whole.content)
      assert.strictEqual(final.usage.output_tokens, whole.usage.output_tokens)
    })
  )

  it.effect("returns a thinking block before the text when thinking is enabled", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const request = { ...base, thinking: { type: "enabled" as const, budget_tokens: 40 } }
      const message = yield* Effect.promise(() => client(server.baseUrl).messages.create(request))
      assert.deepStrictEqual(
        message.content.map((b) => b.type),
        ["thinking", "text"]
      )
      const thinking = message.content[0]!
      assert.isTrue(
        thinking.type === "thinking" && thinking.thinking.length > 0 && thinking.signature.length > 0
      )
      const raw = yield* postAndRead(`${server.baseUrl}/v1/messages`, { ...request, stream: true })
      const deltaTypes = events(raw.text).flatMap((e) =>
        e.event === "content_block_delta" ? [(e.data.delta as { type: string }).type] : []
      )
      assert.strictEqual(deltaTypes[0], "thinking_delta")
      assert.include(deltaTypes, "signature_delta")
      assert.include(deltaTypes, "text_delta")
      const final = yield* Effect.promise(() =>
        client(server.baseUrl).messages.stream(request).finalMessage()
      )
      assert.deepStrictEqual(final.content, message.content)
    })
  )

  it.effect("streams tool_use input as input_json_delta pieces that reassemble to valid JSON", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const raw = yield* postAndRead(`${server.baseUrl}/v1/messages`, { ...base, tools, stream: true })
      const evs = events(raw.text)
      const start = evs.find((e) => e.event === "content_block_start")!.data as unknown as {
        content_block: { type: string; name: string; id: string }
      }
      assert.strictEqual(start.content_block.type, "tool_use")
      assert.strictEqual(start.content_block.name, "get_quote")
      const pieces = evs.flatMap((e) =>
        e.event === "content_block_delta" ? [(e.data.delta as { partial_json: string }).partial_json] : []
      )
      assert.isAbove(pieces.length, 1)
      const input = JSON.parse(pieces.join(""))
      assert.strictEqual(typeof input.symbol, "string")
      assert.strictEqual(input.size, 1)
      const final = yield* Effect.promise(() =>
        client(server.baseUrl)
          .messages.stream({
            ...base,
            tools,
            messages: [{ role: "user", content: "both please [[sim:multi-tool]]" }]
          })
          .finalMessage()
      )
      assert.strictEqual(final.stop_reason, "tool_use")
      assert.deepStrictEqual(
        final.content.map((b) => (b.type === "tool_use" ? b.name : b.type)),
        ["get_quote", "cancel"]
      )
    })
  )

  it.effect("answers in text once the conversation ends with a tool result", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const first = yield* Effect.promise(() => client(server.baseUrl).messages.create({ ...base, tools }))
      const use = first.content.find((b) => b.type === "tool_use")!
      assert.isTrue(use.type === "tool_use")
      const second = yield* Effect.promise(() =>
        client(server.baseUrl).messages.create({
          ...base,
          tools,
          messages: [
            ...base.messages,
            { role: "assistant", content: first.content },
            {
              role: "user",
              content: [
                { type: "tool_result", tool_use_id: use.type === "tool_use" ? use.id : "", content: "42" }
              ]
            }
          ]
        })
      )
      assert.strictEqual(second.stop_reason, "end_turn")
      assert.strictEqual(second.content[0]!.type, "text")
    })
  )

  it.effect("answers JSON matching output_format's schema", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const response = yield* postJson(`${server.baseUrl}/v1/messages`, {
        ...base,
        output_format: {
          type: "json_schema",
          schema: { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"] }
        }
      })
      const body = yield* readJson<Anthropic.Message>(response)
      const block = body.content[0]!
      assert.deepStrictEqual(JSON.parse(block.type === "text" ? block.text : ""), { ok: true })
    })
  )

  it.effect("carries grounded sources in svc_sources (message and message_start)", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const response = yield* postJson(`${server.baseUrl}/v1/messages`, { ...base, model: "grounded-medium" })
      const body = yield* readJson<WithSources<Anthropic.Message>>(response)
      assert.strictEqual(body.svc_sources.length, 3)
      const block = body.content[0]!
      assert.match(block.type === "text" ? block.text : "", /\[\d\]/)
      const raw = yield* postAndRead(`${server.baseUrl}/v1/messages`, {
        ...base,
        model: "grounded-medium",
        stream: true
      })
      const start = events(raw.text)[0]!.data as unknown as { message: { svc_sources: unknown } }
      assert.deepStrictEqual(start.message.svc_sources, body.svc_sources)
    })
  )

  it.effect("answers errors in Anthropic's error shape", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const unknownModel = yield* postJson(`${server.baseUrl}/v1/messages`, { ...base, model: "chat-small" })
      assert.strictEqual(unknownModel.status, 404)
      const body = yield* readJson<AnthropicErrorBody>(unknownModel)
      assert.deepStrictEqual(body.type, "error")
      assert.strictEqual(body.error.type, "not_found_error")
      const invalid = yield* postJson(`${server.baseUrl}/v1/messages`, { model: "chat-large", messages: [] })
      assert.strictEqual(invalid.status, 400)
      assert.strictEqual((yield* readJson<AnthropicErrorBody>(invalid)).error.type, "invalid_request_error")
    })
  )
})
