import type Anthropic from "@anthropic-ai/sdk"
import AnthropicSdk from "@anthropic-ai/sdk"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { postJson } from "../support/Router.ts"
import {
  adaptersRouter,
  dialects,
  parseSse,
  providerRequests,
  sdkClients,
  servedBy,
  waitForBook
} from "./support.ts"

type Message = Anthropic.Messages.Message
type RawEvent = Anthropic.Messages.RawMessageStreamEvent
interface Svc {
  readonly type?: string
  readonly request_id: string
  readonly charged?: number
  readonly auction: { readonly bids: ReadonlyArray<unknown> }
}
const svcOf = (value: unknown) => (value as { svc: Svc }).svc

const tools: Array<Anthropic.Messages.Tool> = [
  {
    name: "get_weather",
    description: "Weather for a city",
    input_schema: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["c", "f"] } },
      required: ["city", "unit"],
      additionalProperties: false
    },
    strict: true
  },
  {
    name: "get_time",
    input_schema: { type: "object", properties: { zone: { type: "string" } }, required: ["zone"] }
  }
]

const textOf = (message: Message) =>
  message.content.map((block) => (block.type === "text" ? block.text : "")).join("")

describe("POST /v1/messages with the official @anthropic-ai/sdk (x402)", () => {
  layer(adaptersRouter, { excludeTestServices: true, timeout: 120_000 })((it) => {
    for (const { dialect, model, reasoningModel, prefix } of dialects) {
      it.effect(`messages.create: text, ${dialect}-dialect provider`, () =>
        Effect.gen(function* () {
          yield* waitForBook
          const { anthropic } = yield* sdkClients
          const message = yield* Effect.promise(() =>
            anthropic.messages.create({
              model,
              max_tokens: 64,
              system: [{ type: "text", text: "You are terse." }],
              messages: [{ role: "user", content: "Explain second-score auctions." }],
              stop_sequences: ["\n\n\n"]
            })
          )
          assert.strictEqual(message.type, "message")
          assert.strictEqual(message.role, "assistant")
          assert.strictEqual(message.stop_reason, "end_turn")
          assert.isAbove(textOf(message).length, 0)
          assert.isAbove(message.usage.input_tokens, 0)
          assert.isAbove(message.usage.output_tokens, 0)
          const svc = svcOf(message)
          assert.isAtLeast(svc.auction.bids.length, 2)
          assert.strictEqual(message._request_id, svc.request_id)
          const receipt = yield* servedBy(svc.request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix), receipt.provider_id)
          assert.strictEqual(receipt.out_tokens, message.usage.output_tokens)
          assert.strictEqual(receipt.charged, svc.charged)
        })
      )

      it.effect(`messages.stream: the event sequence and the accumulated message, ${dialect}`, () =>
        Effect.gen(function* () {
          const { anthropic } = yield* sdkClients
          const { events, final, texts } = yield* Effect.promise(async () => {
            const stream = anthropic.messages.stream({
              model,
              max_tokens: 48,
              messages: [{ role: "user", content: "Stream a short answer." }]
            })
            const texts: Array<string> = []
            stream.on("text", (delta) => texts.push(delta))
            const events: Array<RawEvent> = []
            for await (const event of stream) events.push(event)
            return { events, final: await stream.finalMessage(), texts }
          })
          const types: Array<string> = events.map((e) => e.type)
          // The auction metadata comes first, as an additive event the SDK passes over.
          assert.strictEqual(types[0], "svc.auction_cleared")
          assert.strictEqual(svcOf(events[0]).type, "auction_cleared")
          assert.strictEqual(types[1], "message_start")
          assert.strictEqual(types.at(-2), "message_delta")
          assert.strictEqual(types.at(-1), "message_stop")
          assert.includeMembers(types, ["content_block_start", "content_block_delta", "content_block_stop"])
          assert.isAbove(texts.length, 1)
          assert.strictEqual(texts.join(""), textOf(final))
          assert.strictEqual(final.stop_reason, "end_turn")
          const delta = events.at(-2) as Anthropic.Messages.RawMessageDeltaEvent
          assert.strictEqual(delta.usage.output_tokens, final.usage.output_tokens)
          const charge = svcOf(delta)
          assert.strictEqual(charge.type, "usage")
          const receipt = yield* servedBy(charge.request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix))
          assert.strictEqual(receipt.charged, charge.charged)
        })
      )

      it.effect(`thinking: budget and adaptive, streamed and not, ${dialect}`, () =>
        Effect.gen(function* () {
          const { anthropic } = yield* sdkClients
          const message = yield* Effect.promise(() =>
            anthropic.messages.create({
              model: reasoningModel,
              max_tokens: 2048,
              thinking: { type: "enabled", budget_tokens: 1024 },
              messages: [{ role: "user", content: "Think, then answer." }]
            })
          )
          assert.strictEqual(message.content[0]!.type, "thinking")
          const thinking = message.content[0] as Anthropic.Messages.ThinkingBlock
          assert.isAbove(thinking.thinking.length, 0)
          assert.isAbove(textOf(message).length, 0)
          const receipt = yield* servedBy(svcOf(message).request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix))

          const streamed = yield* Effect.promise(async () => {
            const stream = anthropic.messages.stream({
              model: reasoningModel,
              max_tokens: 2048,
              thinking: { type: "adaptive" },
              output_config: { effort: "low" },
              messages: [{ role: "user", content: "Think adaptively, then answer." }]
            })
            const pieces: Array<string> = []
            stream.on("thinking", (delta) => pieces.push(delta))
            return { pieces, final: await stream.finalMessage() }
          })
          assert.isAbove(streamed.pieces.length, 1)
          const block = streamed.final.content.find(
            (b) => b.type === "thinking"
          ) as Anthropic.Messages.ThinkingBlock
          assert.strictEqual(streamed.pieces.join(""), block.thinking)

          // Thinking off: no thinking blocks reach the caller.
          const plain = yield* Effect.promise(() =>
            anthropic.messages.create({
              model: reasoningModel,
              max_tokens: 256,
              messages: [{ role: "user", content: "Answer directly." }]
            })
          )
          assert.isFalse(plain.content.some((b) => b.type === "thinking"))
        })
      )

      it.effect(
        `tool use round-trip: several calls, input_json in pieces, streamed and not, ${dialect}`,
        () =>
          Effect.gen(function* () {
            const { anthropic } = yield* sdkClients
            const messages: Array<Anthropic.Messages.MessageParam> = [
              { role: "user", content: "Weather and time in Oslo? [[sim:multi-tool]]" }
            ]
            const { final, pieces } = yield* Effect.promise(async () => {
              const stream = anthropic.messages.stream({ model, max_tokens: 256, tools, messages })
              const pieces: Array<string> = []
              stream.on("inputJson", (delta) => pieces.push(delta))
              return { final: await stream.finalMessage(), pieces }
            })
            assert.strictEqual(final.stop_reason, "tool_use")
            const uses = final.content.filter(
              (b): b is Anthropic.Messages.ToolUseBlock => b.type === "tool_use"
            )
            assert.deepStrictEqual(
              uses.map((u) => u.name),
              ["get_weather", "get_time"]
            )
            assert.isAbove(pieces.length, 2)
            assert.deepStrictEqual(Object.keys(uses[0]!.input as object).sort(), ["city", "unit"])
            assert.strictEqual(new Set(uses.map((u) => u.id)).size, 2)

            const direct = yield* Effect.promise(() =>
              anthropic.messages.create({ model, max_tokens: 256, tools, messages })
            )
            assert.deepStrictEqual(
              direct.content
                .filter((b) => b.type === "tool_use")
                .map((b) => (b as Anthropic.Messages.ToolUseBlock).input),
              uses.map((u) => u.input)
            )

            const next = yield* Effect.promise(() =>
              anthropic.messages.create({
                model,
                max_tokens: 128,
                tools,
                tool_choice: { type: "auto" },
                messages: [
                  ...messages,
                  { role: "assistant", content: final.content },
                  {
                    role: "user",
                    content: uses.map((u) => ({
                      type: "tool_result" as const,
                      tool_use_id: u.id,
                      content: JSON.stringify({ ok: u.name })
                    }))
                  }
                ]
              })
            )
            assert.strictEqual(next.stop_reason, "end_turn")
            assert.isFalse(next.content.some((b) => b.type === "tool_use"))
            assert.isAbove(textOf(next).length, 0)
            const receipt = yield* servedBy(svcOf(next).request_id)
            assert.isTrue(receipt.provider_id.startsWith(prefix))
          })
      )

      it.effect(`structured JSON output and a forced tool, ${dialect}`, () =>
        Effect.gen(function* () {
          const { anthropic } = yield* sdkClients
          const structured = yield* Effect.promise(() =>
            anthropic.messages.create({
              model,
              max_tokens: 128,
              messages: [{ role: "user", content: "A city and its population." }],
              output_config: {
                format: {
                  type: "json_schema",
                  schema: {
                    type: "object",
                    properties: { name: { type: "string" }, population: { type: "integer" } },
                    required: ["name", "population"],
                    additionalProperties: false
                  }
                }
              }
            })
          )
          const parsed = JSON.parse(textOf(structured)) as Record<string, unknown>
          assert.typeOf(parsed.name, "string")
          assert.typeOf(parsed.population, "number")

          const forced = yield* Effect.promise(() =>
            anthropic.messages.create({
              model,
              max_tokens: 128,
              tools,
              tool_choice: { type: "tool", name: "get_time" },
              messages: [{ role: "user", content: "What time is it?" }]
            })
          )
          const use = forced.content.find((b) => b.type === "tool_use") as Anthropic.Messages.ToolUseBlock
          assert.strictEqual(use.name, "get_time")
        })
      )
    }

    it.effect("countTokens: a local estimate; no auction, no payment, no provider call", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { anthropicUnpaid } = yield* sdkClients
        const before = yield* providerRequests
        const small = yield* Effect.promise(() =>
          anthropicUnpaid.messages.countTokens({
            model: "chat-large",
            messages: [{ role: "user", content: "Hello there" }]
          })
        )
        const large = yield* Effect.promise(() =>
          anthropicUnpaid.messages.countTokens({
            model: "chat-large",
            system: "You are a careful assistant.",
            tools,
            messages: [{ role: "user", content: "Hello there, ".repeat(200) }]
          })
        )
        assert.isAbove(small.input_tokens, 2)
        assert.isAbove(large.input_tokens, small.input_tokens + 400)
        assert.strictEqual(yield* providerRequests, before)
      })
    )

    it.effect("errors in Anthropic's shape, before payment and provider work", () =>
      Effect.gen(function* () {
        const { anthropicUnpaid } = yield* sdkClients
        const before = yield* providerRequests
        const hosted = yield* postJson("/v1/messages", {
          model: "chat-large",
          max_tokens: 64,
          tools: [{ type: "web_search_20250305", name: "web_search" }],
          messages: [{ role: "user", content: "Search" }]
        })
        assert.strictEqual(hosted.status, 400)
        assert.deepStrictEqual((hosted.json as { type: string }).type, "error")
        assert.strictEqual((hosted.json as { error: { type: string } }).error.type, "invalid_request_error")
        assert.isNull(hosted.headers.get("payment-required"))

        // The official client surfaces it as its own typed 400.
        const computer = yield* Effect.promise(() =>
          anthropicUnpaid.messages
            .create({
              model: "chat-large",
              max_tokens: 64,
              tools: [
                { type: "computer_20250124", name: "computer", display_width_px: 800, display_height_px: 600 }
              ],
              messages: [{ role: "user", content: "Click" }]
            } as unknown as Anthropic.Messages.MessageCreateParamsNonStreaming)
            .then(
              () => undefined,
              (error: unknown) => error
            )
        )
        assert.instanceOf(computer, AnthropicSdk.BadRequestError)
        const apiError = computer as InstanceType<typeof AnthropicSdk.BadRequestError>
        assert.strictEqual(apiError.status, 400)
        assert.strictEqual(
          (apiError.error as { error: { type: string } }).error.type,
          "invalid_request_error"
        )
        assert.match(apiError.message, /computer_20250124/)

        const unknown = yield* postJson("/v1/messages", {
          model: "claude-unknown",
          max_tokens: 64,
          messages: [{ role: "user", content: "hi" }]
        })
        assert.strictEqual(unknown.status, 404)
        assert.strictEqual((unknown.json as { error: { type: string } }).error.type, "not_found_error")

        const malformed = yield* postJson("/v1/messages", { model: "chat-large", messages: [] })
        assert.strictEqual(malformed.status, 400)
        assert.strictEqual((malformed.json as { type: string }).type, "error")
        assert.strictEqual(yield* providerRequests, before)

        const unpaid = yield* postJson("/v1/messages", {
          model: "chat-large",
          max_tokens: 64,
          messages: [{ role: "user", content: "hi" }]
        })
        assert.strictEqual(unpaid.status, 402)
        assert.isNotNull(unpaid.headers.get("payment-required"))
      })
    )

    it.effect("the raw wire: SSE frames name their event type; the auction event comes first", () =>
      Effect.gen(function* () {
        const { anthropic } = yield* sdkClients
        const raw = yield* Effect.promise(async () => {
          const response = await anthropic.messages
            .create({
              model: "chat-medium",
              max_tokens: 24,
              stream: true,
              messages: [{ role: "user", content: "hi" }]
            })
            .asResponse()
          return response.text()
        })
        const frames = parseSse(raw)
        for (const frame of frames) assert.strictEqual(frame.event, frame.data.type)
        assert.strictEqual(frames[0]!.event, "svc.auction_cleared")
        assert.strictEqual(frames[1]!.event, "message_start")
      })
    )
  })
})
