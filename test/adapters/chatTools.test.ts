import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import type OpenAI from "openai"
import { adaptersRouter, dialects, sdkClients, servedBy, waitForBook } from "./support.ts"

/** The third dialect of issue 6 item 4: chat-completions tools against providers of both dialects. */
const tools: Array<OpenAI.Chat.ChatCompletionTool> = [
  {
    type: "function",
    function: {
      name: "get_weather",
      parameters: {
        type: "object",
        properties: { city: { type: "string" } },
        required: ["city"],
        additionalProperties: false
      },
      strict: true
    }
  },
  {
    type: "function",
    function: {
      name: "get_time",
      parameters: { type: "object", properties: { zone: { type: "string" } }, required: ["zone"] }
    }
  }
]

const requestIdOf = (value: unknown) => (value as { svc: { request_id: string } }).svc.request_id

describe("chat completions: function tools round-trip (official openai SDK, x402)", () => {
  layer(adaptersRouter, { excludeTestServices: true, timeout: 120_000 })((it) => {
    for (const { dialect, model, prefix } of dialects) {
      it.effect(`several calls streamed in pieces, results fed back, ${dialect}-dialect provider`, () =>
        Effect.gen(function* () {
          yield* waitForBook
          const { openai } = yield* sdkClients
          const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [
            { role: "user", content: "Weather and time in Oslo? [[sim:multi-tool]]" }
          ]
          const chunks = yield* Effect.promise(async () => {
            const stream = await openai.chat.completions.create({
              model,
              messages,
              tools,
              max_tokens: 256,
              stream: true
            })
            const out: Array<OpenAI.Chat.ChatCompletionChunk> = []
            for await (const chunk of stream) out.push(chunk)
            return out
          })
          const pieces = new Map<number, { id: string; name: string; args: Array<string> }>()
          for (const chunk of chunks) {
            for (const call of chunk.choices[0]?.delta?.tool_calls ?? []) {
              const entry = pieces.get(call.index) ?? { id: "", name: "", args: [] }
              if (call.id) entry.id = call.id
              if (call.function?.name) entry.name = call.function.name
              if (call.function?.arguments) entry.args.push(call.function.arguments)
              pieces.set(call.index, entry)
            }
          }
          const calls = [...pieces.values()]
          assert.deepStrictEqual(
            calls.map((c) => c.name),
            ["get_weather", "get_time"]
          )
          for (const c of calls) {
            assert.isAbove(c.args.length, 1)
            assert.isObject(JSON.parse(c.args.join("")))
          }
          assert.strictEqual(
            chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0]?.finish_reason,
            "tool_calls"
          )

          const direct = yield* Effect.promise(() =>
            openai.chat.completions.create({ model, messages, tools, max_tokens: 256 })
          )
          const toolCalls = direct.choices[0]!.message.tool_calls!.filter((c) => c.type === "function")
          assert.deepStrictEqual(
            toolCalls.map((c) => c.function.arguments),
            calls.map((c) => c.args.join(""))
          )

          const next = yield* Effect.promise(() =>
            openai.chat.completions.create({
              model,
              tools,
              max_tokens: 128,
              messages: [
                ...messages,
                direct.choices[0]!.message,
                ...toolCalls.map((c) => ({
                  role: "tool" as const,
                  tool_call_id: c.id,
                  content: JSON.stringify({ ok: c.function.name })
                }))
              ]
            })
          )
          assert.strictEqual(next.choices[0]!.finish_reason, "stop")
          assert.isAbove(next.choices[0]!.message.content!.length, 0)
          const receipt = yield* servedBy(requestIdOf(next))
          assert.isTrue(receipt.provider_id.startsWith(prefix), receipt.provider_id)
        })
      )
    }
  })
})
