import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import OpenAI from "openai"
import { ProviderServer } from "../../src/devnet/fleet/ProviderServer.ts"
import {
  dataLines,
  fastOptions,
  type OpenAiErrorBody,
  postAndRead,
  postJson,
  readJson,
  type WithSources
} from "./sse.ts"

const client = (baseUrl: string) => new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: "sim", maxRetries: 0 })

const messages = [
  { role: "system" as const, content: "You are terse." },
  { role: "user" as const, content: "Explain a second-score auction." }
]

const tools = [
  {
    type: "function" as const,
    function: {
      name: "get_quote",
      parameters: {
        type: "object",
        properties: { symbol: { type: "string" }, size: { type: "number" }, firm: { type: "boolean" } },
        required: ["symbol", "size", "firm"]
      }
    }
  },
  {
    type: "function" as const,
    function: {
      name: "cancel",
      parameters: { type: "object", properties: { id: { type: "string" } }, required: ["id"] }
    }
  }
]

layer(ProviderServer.layer(fastOptions()), { excludeTestServices: true })("openai dialect", (it) => {
  it.effect("answers a non-streaming completion with usage in OpenAI's fields", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const completion = yield* Effect.promise(() =>
        client(server.baseUrl).chat.completions.create({ model: "chat-medium", messages })
      )
      assert.strictEqual(completion.object, "chat.completion")
      const choice = completion.choices[0]!
      assert.strictEqual(choice.message.role, "assistant")
      assert.isAbove(choice.message.content!.length, 0)
      assert.strictEqual(choice.finish_reason, "stop")
      assert.isAbove(completion.usage!.prompt_tokens, 0)
      assert.isAbove(completion.usage!.completion_tokens, 0)
      assert.strictEqual(completion.usage!.completion_tokens_details!.reasoning_tokens, 0)
      assert.strictEqual(
        completion.usage!.total_tokens,
        completion.usage!.prompt_tokens + completion.usage!.completion_tokens
      )

      const again = yield* Effect.promise(() =>
        client(server.baseUrl).chat.completions.create({ model: "chat-medium", messages })
      )
      assert.strictEqual(again.choices[0]!.message.content, choice.message.content)
      assert.notStrictEqual(again.id, completion.id)
    })
  )

  it.effect("streams chunks that reassemble to the non-streaming text, then usage, then [DONE]", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const url = `${server.baseUrl}/v1/chat/completions`
      const whole = yield* postJson(url, { model: "chat-medium", messages }).pipe(
        Effect.flatMap(readJson<OpenAI.ChatCompletion>)
      )
      const streamed = yield* postAndRead(url, { model: "chat-medium", messages, stream: true })
      assert.strictEqual(streamed.status, 200)
      assert.isUndefined(streamed.error)
      const lines = dataLines(streamed.text)
      assert.strictEqual(lines.at(-1), "[DONE]")
      const chunks = lines.slice(0, -1).map((l) => JSON.parse(l))
      for (const chunk of chunks) assert.strictEqual(chunk.object, "chat.completion.chunk")
      const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")
      assert.strictEqual(text, whole.choices[0]!.message.content)
      const usageChunk = chunks.at(-1)
      assert.deepStrictEqual(usageChunk.choices, [])
      assert.deepStrictEqual(usageChunk.usage, whole.usage)
      assert.strictEqual(chunks.at(-2).choices[0].finish_reason, "stop")
      // One chunk per completion token between the role chunk and the finish chunk.
      assert.strictEqual(chunks.length - 3, whole.usage!.completion_tokens)
    })
  )

  it.effect("returns reasoning_content when reasoning is asked, counted in reasoning_tokens", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const sdk = client(server.baseUrl)
      const completion = yield* Effect.promise(() =>
        sdk.chat.completions.create({ model: "chat-medium", messages, reasoning_effort: "high" })
      )
      const message = completion.choices[0]!.message as (typeof completion.choices)[0]["message"] & {
        reasoning_content?: string
      }
      assert.isAbove(message.reasoning_content!.length, 0)
      assert.isAbove(completion.usage!.completion_tokens_details!.reasoning_tokens!, 0)
      const stream = yield* postAndRead(`${server.baseUrl}/v1/chat/completions`, {
        model: "chat-medium",
        messages,
        include_reasoning: true,
        stream: true
      })
      const chunks = dataLines(stream.text)
        .slice(0, -1)
        .map((l) => JSON.parse(l))
      assert.isAbove(chunks.filter((c) => c.choices[0]?.delta.reasoning_content !== undefined).length, 0)
    })
  )

  it.effect("streams tool-call arguments in pieces that reassemble to valid JSON", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const stream = yield* postAndRead(`${server.baseUrl}/v1/chat/completions`, {
        model: "chat-medium",
        messages,
        tools,
        stream: true
      })
      const deltas = dataLines(stream.text)
        .slice(0, -1)
        .map((l) => JSON.parse(l))
        .flatMap((c) => c.choices[0]?.delta.tool_calls ?? [])
      assert.isAbove(deltas.length, 2)
      assert.strictEqual(deltas[0].function.name, "get_quote")
      assert.match(deltas[0].id, /^call_/)
      const args = JSON.parse(
        deltas.map((d: { function: { arguments?: string } }) => d.function.arguments ?? "").join("")
      )
      assert.strictEqual(typeof args.symbol, "string")
      assert.strictEqual(args.size, 1)
      assert.strictEqual(args.firm, true)

      const sdkFinal = yield* Effect.promise(() =>
        client(server.baseUrl)
          .chat.completions.stream({ model: "chat-medium", messages, tools })
          .finalChatCompletion()
      )
      assert.strictEqual(sdkFinal.choices[0]!.finish_reason, "tool_calls")
      const call = sdkFinal.choices[0]!.message.tool_calls![0]!
      assert.strictEqual(call.type === "function" && call.function.name, "get_quote")
    })
  )

  it.effect("calls several tools with [[sim:multi-tool]]", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const completion = yield* Effect.promise(() =>
        client(server.baseUrl).chat.completions.create({
          model: "chat-medium",
          messages: [{ role: "user", content: "do both [[sim:multi-tool]]" }],
          tools
        })
      )
      const calls = completion.choices[0]!.message.tool_calls!
      assert.deepStrictEqual(
        calls.map((c) => (c.type === "function" ? c.function.name : "")),
        ["get_quote", "cancel"]
      )
      for (const c of calls) if (c.type === "function") JSON.parse(c.function.arguments)
      assert.isNull(completion.choices[0]!.message.content)
    })
  )

  it.effect("answers JSON when a JSON schema response format is asked", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const completion = yield* Effect.promise(() =>
        client(server.baseUrl).chat.completions.create({
          model: "chat-medium",
          messages,
          response_format: {
            type: "json_schema",
            json_schema: {
              name: "verdict",
              schema: {
                type: "object",
                properties: {
                  verdict: { type: "string", enum: ["yes", "no"] },
                  confidence: { type: "number" }
                },
                required: ["verdict", "confidence"]
              }
            }
          }
        })
      )
      assert.deepStrictEqual(JSON.parse(completion.choices[0]!.message.content!), {
        verdict: "yes",
        confidence: 1
      })
    })
  )

  it.effect("carries grounded sources in svc_sources with [n] markers in the text", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const body = yield* postJson(`${server.baseUrl}/v1/chat/completions`, {
        model: "grounded-medium",
        messages
      }).pipe(Effect.flatMap(readJson<WithSources<OpenAI.ChatCompletion>>))
      assert.strictEqual(body.svc_sources.length, 3)
      assert.match(body.svc_sources[0]!.url, /^https:\/\/example\.org\//)
      assert.match(body.choices[0]!.message.content!, /\[\d\]/)
      const stream = yield* postAndRead(`${server.baseUrl}/v1/chat/completions`, {
        model: "grounded-medium",
        messages,
        stream: true
      })
      assert.deepStrictEqual(JSON.parse(dataLines(stream.text)[0]!).svc_sources, body.svc_sources)
    })
  )

  it.effect("answers errors in OpenAI's error shape", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer
      const url = `${server.baseUrl}/v1/chat/completions`
      const unknownModel = yield* postJson(url, { model: "chat-large", messages })
      assert.strictEqual(unknownModel.status, 404)
      const notFound = yield* readJson<OpenAiErrorBody>(unknownModel)
      assert.strictEqual(notFound.error.code, "model_not_found")
      const invalid = yield* postJson(url, { model: "chat-medium" })
      assert.strictEqual(invalid.status, 400)
      assert.strictEqual((yield* readJson<OpenAiErrorBody>(invalid)).error.type, "invalid_request_error")
    })
  )
})

describe("openai dialect counters", () => {
  it.live("count requests by path, including paths nobody serves", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer.make(fastOptions())
      assert.deepStrictEqual((yield* server.counters).requests, {})
      yield* postJson(`${server.baseUrl}/v1/chat/completions`, { model: "chat-medium", messages })
      const missing = yield* postJson(`${server.baseUrl}/v1/messages?x=1`, {})
      assert.strictEqual(missing.status, 404)
      assert.deepStrictEqual((yield* server.counters).requests, {
        "/v1/chat/completions": 1,
        "/v1/messages": 1
      })
    }).pipe(Effect.scoped)
  )
})
