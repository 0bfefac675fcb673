import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import type OpenAI from "openai"
import { call, postJson } from "../support/Router.ts"
import {
  adaptersRouter,
  dialects,
  parseSse,
  providerRequests,
  sdkClients,
  servedBy,
  waitForBook
} from "./support.ts"

type StreamEvent = OpenAI.Responses.ResponseStreamEvent
interface Svc {
  readonly type?: string
  readonly request_id: string
  readonly auction: { readonly bids: ReadonlyArray<unknown>; readonly winner: { provider: string } }
}
const svcOf = (value: unknown) => (value as { svc: Svc }).svc

const tools: Array<OpenAI.Responses.FunctionTool> = [
  {
    type: "function",
    name: "get_weather",
    description: "Weather for a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["c", "f"] } },
      required: ["city", "unit"],
      additionalProperties: false
    },
    strict: true
  },
  {
    type: "function",
    name: "get_time",
    parameters: {
      type: "object",
      properties: { zone: { type: "string" } },
      required: ["zone"],
      additionalProperties: false
    },
    strict: true
  }
]

const collect = (stream: AsyncIterable<StreamEvent>) =>
  Effect.promise(async () => {
    const events: Array<StreamEvent> = []
    for await (const event of stream) events.push(event)
    return events
  })

const typesOf = (events: ReadonlyArray<{ type: string }>) => events.map((e) => e.type)

describe("POST /v1/responses with the official openai SDK (x402)", () => {
  layer(adaptersRouter, { excludeTestServices: true, timeout: 120_000 })((it) => {
    for (const { dialect, model, reasoningModel, prefix } of dialects) {
      it.effect(`non-streaming text, served by an ${dialect}-dialect provider`, () =>
        Effect.gen(function* () {
          yield* waitForBook
          const { openai } = yield* sdkClients
          const { data, response } = yield* Effect.promise(() =>
            openai.responses
              .create({ model, input: "Tell me about second-score auctions.", max_output_tokens: 64 })
              .withResponse()
          )
          assert.strictEqual(data.object, "response")
          assert.strictEqual(data.status, "completed")
          assert.match(data.id, /^resp_/)
          const message = data.output.find((o) => o.type === "message")!
          assert.strictEqual(message.role, "assistant")
          assert.isAbove(data.output_text.length, 0)
          assert.isAbove(data.usage!.output_tokens, 0)
          assert.isAbove(data.usage!.input_tokens, 0)
          assert.strictEqual(data.usage!.total_tokens, data.usage!.input_tokens + data.usage!.output_tokens)
          const svc = svcOf(data)
          assert.strictEqual(svc.request_id, response.headers.get("x-request-id"))
          assert.isAtLeast(svc.auction.bids.length, 2)
          const receipt = yield* servedBy(svc.request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix), receipt.provider_id)
          assert.strictEqual(receipt.out_tokens, data.usage!.output_tokens)
        })
      )

      it.effect(`streaming event sequence, ${dialect} dialect`, () =>
        Effect.gen(function* () {
          const { openai } = yield* sdkClients
          const events = yield* collect(
            yield* Effect.promise(() =>
              openai.responses.create({
                model,
                input: "Stream a short answer.",
                max_output_tokens: 48,
                stream: true
              })
            )
          )
          const types = typesOf(events)
          assert.strictEqual(types[0], "response.created")
          // The auction metadata rides on the first event, before any content.
          const cleared = svcOf((events[0] as { response: unknown }).response)
          assert.strictEqual(cleared.type, "auction_cleared")
          assert.isAtLeast(cleared.auction.bids.length, 2)
          assert.strictEqual(types[1], "response.in_progress")
          assert.strictEqual(types.at(-1), "response.completed")
          const order = [
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
          ]
          const positions = order.map((t) => types.indexOf(t as StreamEvent["type"]))
          assert.deepStrictEqual(
            positions,
            [...positions].sort((a, b) => a - b)
          )
          assert.isTrue(positions.every((p) => p >= 0))
          const sequence = events.map((e) => e.sequence_number)
          assert.deepStrictEqual(
            sequence,
            sequence.map((_, i) => i)
          )
          const deltas = events.flatMap((e) => (e.type === "response.output_text.delta" ? [e.delta] : []))
          assert.isAbove(deltas.length, 1)
          const completed = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent
          const finalText = completed.response.output
            .flatMap((o) => (o.type === "message" ? o.content : []))
            .map((c) => (c.type === "output_text" ? c.text : ""))
            .join("")
          assert.strictEqual(deltas.join(""), finalText)
          assert.isAbove(completed.response.usage!.output_tokens, 0)
          const receipt = yield* servedBy(svcOf(completed.response).request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix))
        })
      )

      it.effect(`function tools round-trip, several calls in one turn, streamed and not, ${dialect}`, () =>
        Effect.gen(function* () {
          const { openai } = yield* sdkClients
          const input: Array<OpenAI.Responses.ResponseInputItem> = [
            { role: "user", content: "What is the weather and the time in Oslo? [[sim:multi-tool]]" }
          ]
          // Streamed first turn: several calls, arguments arriving in pieces.
          const events = yield* collect(
            yield* Effect.promise(() =>
              openai.responses.create({ model, input, tools, max_output_tokens: 256, stream: true })
            )
          )
          const completed = events.find((e) => e.type === "response.completed")!.response
          const calls = completed.output.filter(
            (o): o is OpenAI.Responses.ResponseFunctionToolCall => o.type === "function_call"
          )
          assert.deepStrictEqual(
            calls.map((c) => c.name),
            ["get_weather", "get_time"]
          )
          for (const c of calls) {
            const pieces = events.flatMap((e) =>
              e.type === "response.function_call_arguments.delta" && e.item_id === c.id ? [e.delta] : []
            )
            assert.isAbove(pieces.length, 1, "arguments stream in pieces")
            assert.strictEqual(pieces.join(""), c.arguments)
            const done = events.find(
              (e) => e.type === "response.function_call_arguments.done" && e.item_id === c.id
            ) as OpenAI.Responses.ResponseFunctionCallArgumentsDoneEvent
            assert.strictEqual(done.arguments, c.arguments)
            assert.isObject(JSON.parse(c.arguments))
          }
          assert.deepStrictEqual(Object.keys(JSON.parse(calls[0]!.arguments)).sort(), ["city", "unit"])
          assert.strictEqual(new Set(calls.map((c) => c.call_id)).size, 2)

          // Non-streaming second turn: the outputs are fed back; the model answers in text.
          const next = yield* Effect.promise(() =>
            openai.responses.create({
              model,
              tools,
              max_output_tokens: 128,
              input: [
                ...input,
                ...calls,
                ...calls.map((c) => ({
                  type: "function_call_output" as const,
                  call_id: c.call_id,
                  output: JSON.stringify({ ok: c.name })
                }))
              ]
            })
          )
          assert.strictEqual(next.status, "completed")
          assert.isFalse(next.output.some((o) => o.type === "function_call"))
          assert.isAbove(next.output_text.length, 0)
          const receipt = yield* servedBy(svcOf(next).request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix))

          // Non-streaming tool turn too: the same calls as items.
          const direct = yield* Effect.promise(() =>
            openai.responses.create({ model, input, tools, max_output_tokens: 256 })
          )
          assert.deepStrictEqual(
            direct.output.filter((o) => o.type === "function_call").map((o) => o.arguments),
            calls.map((c) => c.arguments)
          )
        })
      )

      it.effect(`JSON-schema output and reasoning, ${dialect}`, () =>
        Effect.gen(function* () {
          const { openai } = yield* sdkClients
          const structured = yield* Effect.promise(() =>
            openai.responses.create({
              model,
              input: "Give me a city and its population.",
              max_output_tokens: 128,
              text: {
                format: {
                  type: "json_schema",
                  name: "city",
                  strict: true,
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
          const parsed = JSON.parse(structured.output_text) as Record<string, unknown>
          assert.typeOf(parsed.name, "string")
          assert.typeOf(parsed.population, "number")

          const reasoned = yield* Effect.promise(() =>
            openai.responses.create({
              model: reasoningModel,
              input: "Think, then answer briefly.",
              max_output_tokens: 2048,
              reasoning: { effort: "low", summary: "auto" }
            })
          )
          const reasoning = reasoned.output.find(
            (o): o is OpenAI.Responses.ResponseReasoningItem => o.type === "reasoning"
          )
          assert.isDefined(reasoning)
          assert.isAbove(reasoning!.content![0]!.text.length, 0)
          assert.strictEqual(
            reasoned.output.findIndex((o) => o.type === "reasoning"),
            0
          )
          assert.isAbove(reasoned.usage!.output_tokens_details.reasoning_tokens, 0)
          const receipt = yield* servedBy(svcOf(reasoned).request_id)
          assert.isTrue(receipt.provider_id.startsWith(prefix))

          // Without a summary (or include_reasoning) the reasoning is metered, not shown.
          const hidden = yield* Effect.promise(() =>
            openai.responses.create({
              model: reasoningModel,
              input: "Think, then answer briefly.",
              max_output_tokens: 2048,
              reasoning: { effort: "low" }
            })
          )
          assert.isFalse(hidden.output.some((o) => o.type === "reasoning"))
          assert.isAbove(hidden.usage!.output_tokens_details.reasoning_tokens, 0)
        })
      )
    }

    it.effect("an Idempotency-Key replays the original response: one charge, one provider call", () =>
      Effect.gen(function* () {
        const { openai } = yield* sdkClients
        const key = `idem-${Math.random().toString(36).slice(2)}`
        const body = { model: "chat-medium", input: "Once only.", max_output_tokens: 24 }
        const first = yield* Effect.promise(() =>
          openai.responses.create(body, { headers: { "Idempotency-Key": key } })
        )
        const before = yield* providerRequests
        const again = yield* Effect.promise(() =>
          openai.responses.create(body, { headers: { "Idempotency-Key": key } })
        )
        assert.strictEqual(again.id, first.id)
        assert.strictEqual(again.output_text, first.output_text)
        assert.strictEqual(yield* providerRequests, before)
      })
    )

    it.effect("the official responses.stream() helper accumulates the same response", () =>
      Effect.gen(function* () {
        const { openai } = yield* sdkClients
        const final = yield* Effect.promise(async () => {
          const stream = openai.responses.stream({
            model: "chat-medium",
            input: "Hello",
            max_output_tokens: 32
          })
          return stream.finalResponse()
        })
        assert.strictEqual(final.status, "completed")
        assert.isAbove(final.output_text.length, 0)
      })
    )

    it.effect("grounded replies: url_citation annotations, announced before the content part completes", () =>
      Effect.gen(function* () {
        const { openai } = yield* sdkClients
        const events = yield* collect(
          yield* Effect.promise(() =>
            openai.responses.create({
              model: "grounded-medium",
              input: "What happened in the market today?",
              max_output_tokens: 128,
              stream: true
            })
          )
        )
        const types = typesOf(events)
        const annotationAt = types.indexOf("response.output_text.annotation.added")
        assert.isAtLeast(annotationAt, 0)
        assert.isBelow(annotationAt, types.indexOf("response.content_part.done"))
        assert.isAbove(annotationAt, types.indexOf("response.output_text.done"))
        const completed = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent
        const part = completed.response.output
          .flatMap((o) => (o.type === "message" ? o.content : []))
          .find((c) => c.type === "output_text")!
        assert.isAbove(part.annotations.length, 0)
        for (const annotation of part.annotations) {
          assert.strictEqual(annotation.type, "url_citation")
          if (annotation.type !== "url_citation") continue
          assert.match(part.text.slice(annotation.start_index, annotation.end_index), /^\[\d+\]$/)
          assert.match(annotation.url, /^https:\/\/example\.org\//)
        }
        const sources = (completed.response as unknown as { svc_sources: Array<{ id: string }> }).svc_sources
        assert.isAbove(sources.length, 0)
      })
    )

    it.effect("hosted tools fail closed before payment: no 402, no provider call", () =>
      Effect.gen(function* () {
        const before = yield* providerRequests
        for (const tool of [
          { type: "web_search" },
          { type: "computer_use_preview" },
          { type: "file_search" }
        ]) {
          const reply = yield* postJson("/v1/responses", {
            model: "chat-medium",
            input: "Search the web",
            tools: [tool]
          })
          assert.strictEqual(reply.status, 400, reply.text)
          const body = reply.json as { error: { code: string; type: string; param: string } }
          assert.strictEqual(body.error.code, "unsupported_capability")
          assert.strictEqual(body.error.param, "tools")
          assert.isNull(reply.headers.get("payment-required"))
        }
        const computerItem = yield* postJson("/v1/responses", {
          model: "chat-medium",
          input: [{ type: "computer_call_output", call_id: "c1", output: { type: "input_image" } }]
        })
        assert.strictEqual(computerItem.status, 400)
        assert.strictEqual(
          (computerItem.json as { error: { code: string } }).error.code,
          "unsupported_capability"
        )
        assert.strictEqual(yield* providerRequests, before)
      })
    )

    it.effect("refusals in OpenAI's shape: stored state, empty input, unknown model", () =>
      Effect.gen(function* () {
        const stored = yield* postJson("/v1/responses", {
          model: "chat-medium",
          input: "continue",
          previous_response_id: "resp_123"
        })
        assert.strictEqual(stored.status, 400)
        assert.strictEqual((stored.json as { error: { param: string } }).error.param, "previous_response_id")
        const empty = yield* postJson("/v1/responses", { model: "chat-medium", input: [] })
        assert.strictEqual(empty.status, 400)
        const unknown = yield* postJson("/v1/responses", { model: "no-such-class", input: "hi" })
        assert.strictEqual(unknown.status, 404)
        assert.strictEqual((unknown.json as { error: { code: string } }).error.code, "model_not_found")
        const unpaid = yield* postJson("/v1/responses", { model: "chat-medium", input: "hi" })
        assert.strictEqual(unpaid.status, 402)
        assert.isNotNull(unpaid.headers.get("payment-required"))
      })
    )

    it.effect("the raw wire: SSE frames name their event type", () =>
      Effect.gen(function* () {
        const unpaid = yield* call("/v1/responses", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "chat-medium", input: "hi", stream: true })
        })
        assert.strictEqual(unpaid.status, 402)
        const { openai } = yield* sdkClients
        const raw = yield* Effect.promise(async () => {
          const response = await openai.responses
            .create({ model: "chat-medium", input: "Raw wire please.", max_output_tokens: 24, stream: true })
            .asResponse()
          return response.text()
        })
        const frames = parseSse(raw)
        for (const frame of frames) assert.strictEqual(frame.event, frame.data.type)
        assert.strictEqual(frames[0]!.event, "response.created")
        assert.strictEqual(svcOf(frames[0]!.data.response).type, "auction_cleared")
      })
    )
  })
})
