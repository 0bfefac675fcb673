import { assert, describe, it } from "@effect/vitest"
import { Effect, Result, Stream } from "effect"
import fc from "fast-check"
import type { ChatCompletionRequest, ChatMessage, FunctionTool } from "../../../src/domain/Chat.ts"
import type { MessagesStreamEvent as AnthropicStreamEvent } from "../../../src/domain/Messages.ts"
import type { UpstreamEvent } from "../../../src/inference/Events.ts"
import {
  type AnthropicStreamState,
  anthropicEventToEvents,
  chatMessagesToTurns,
  chatRequestToMessagesRequest,
  initialAnthropicState,
  type MessagesContentBlock
} from "../../../src/inference/upstream/AnthropicMessages.ts"
import { anthropicCodec, decodeUpstreamStream } from "../../../src/inference/upstream/Upstream.ts"

// ---------------------------------------------------------------------------------------------
// Request translation

const text = fc.string({ maxLength: 16 })
const content = fc.oneof(
  text,
  fc.array(fc.record({ type: fc.constant("text" as const), text }), { maxLength: 3 })
)
const toolCall = fc.record({
  id: fc.stringMatching(/^call_[a-z0-9]{1,8}$/),
  type: fc.constant("function" as const),
  function: fc.record({
    name: fc.stringMatching(/^[a-z_]{1,10}$/),
    arguments: fc
      .dictionary(fc.string({ maxLength: 6 }), fc.jsonValue({ maxDepth: 2 }))
      .map((o) => JSON.stringify(o))
  })
})
const message: fc.Arbitrary<ChatMessage> = fc.oneof(
  fc.record({ role: fc.constantFrom("system" as const, "developer" as const), content }),
  fc.record({ role: fc.constant("user" as const), content }),
  fc.record(
    {
      role: fc.constant("assistant" as const),
      content: fc.option(content, { nil: null }),
      tool_calls: fc.array(toolCall, { maxLength: 3 })
    },
    { requiredKeys: ["role"] }
  ),
  fc.record({
    role: fc.constant("tool" as const),
    content: text,
    tool_call_id: fc.stringMatching(/^call_[a-z0-9]{1,8}$/)
  })
)

const textsOf = (content: ChatMessage["content"]): Array<string> =>
  content === undefined || content === null
    ? []
    : typeof content === "string"
      ? [content]
      : content.flatMap((p) => (p.type === "text" ? [p.text] : []))

const nonEmpty = (texts: ReadonlyArray<string>) => texts.filter((t) => t.length > 0)

describe("chat request to Messages request", () => {
  it("keeps every user and assistant text, every tool call and result, and joins system messages", () => {
    fc.assert(
      fc.property(fc.array(message, { minLength: 1, maxLength: 12 }), (messages) => {
        const { system, turns } = chatMessagesToTurns(messages)
        const systemTexts = messages
          .filter((m) => m.role === "system" || m.role === "developer")
          .map((m) => textsOf(m.content).join("\n"))
          .filter((t) => t.length > 0)
        assert.strictEqual(system, systemTexts.length > 0 ? systemTexts.join("\n\n") : undefined)

        const blocks = (role: "user" | "assistant") =>
          turns.filter((t) => t.role === role).flatMap((t) => t.content)
        for (const role of ["user", "assistant"] as const) {
          const sent = nonEmpty(messages.filter((m) => m.role === role).flatMap((m) => textsOf(m.content)))
          const kept = blocks(role).flatMap((b) => (b.type === "text" ? [b.text] : []))
          assert.deepStrictEqual(kept, sent)
        }

        const calls = messages.flatMap((m) => m.tool_calls ?? [])
        const uses = blocks("assistant").filter((b) => b.type === "tool_use")
        assert.deepStrictEqual(
          uses.map((b) => ({ id: b.id, name: b.name, input: b.input })),
          calls.map((c) => ({ id: c.id, name: c.function.name, input: JSON.parse(c.function.arguments) }))
        )

        const results = blocks("user").filter((b) => b.type === "tool_result")
        const toolMessages = messages.filter((m) => m.role === "tool")
        assert.deepStrictEqual(
          results.map((b) => `${b.tool_use_id}=${JSON.stringify(b.content)}`),
          toolMessages.map((m) => `${m.tool_call_id}=${JSON.stringify(textsOf(m.content).join("\n"))}`)
        )

        for (let i = 1; i < turns.length; i++) assert.notStrictEqual(turns[i]!.role, turns[i - 1]!.role)
        for (const turn of turns) assert.isAbove(turn.content.length, 0)
      }),
      { numRuns: 300 }
    )
  })

  const tools: ReadonlyArray<typeof FunctionTool.Type> = [
    {
      type: "function",
      function: {
        name: "get_quote",
        description: "Quote a symbol",
        parameters: { type: "object", properties: { symbol: { type: "string" } }, required: ["symbol"] },
        strict: true
      }
    },
    { type: "function", function: { name: "ping" } }
  ]
  const base: ChatCompletionRequest = {
    model: "auto",
    messages: [
      { role: "system", content: "Be terse." },
      {
        role: "user",
        content: [
          { type: "text", text: "What is this?" },
          { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } },
          { type: "image_url", image_url: { url: "https://example.org/cat.jpg" } }
        ]
      }
    ],
    tools
  }

  it("maps tools, images, stop sequences and the output format", () => {
    const body = chatRequestToMessagesRequest(
      {
        ...base,
        tool_choice: { type: "function", function: { name: "get_quote" } },
        stop: "END",
        response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } },
        temperature: 1.6,
        seed: 7,
        routing: { task: "t" },
        include_reasoning: true
      },
      "chat-medium",
      512
    )
    assert.strictEqual(body.model, "chat-medium")
    assert.strictEqual(body.max_tokens, 512)
    assert.strictEqual(body.stream, true)
    assert.strictEqual(body.system, "Be terse.")
    assert.deepStrictEqual(body.messages[0]!.content.slice(1), [
      { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
      { type: "image", source: { type: "url", url: "https://example.org/cat.jpg" } }
    ] satisfies Array<MessagesContentBlock>)
    assert.deepStrictEqual(body.tools, [
      {
        name: "get_quote",
        description: "Quote a symbol",
        input_schema: { type: "object", properties: { symbol: { type: "string" } }, required: ["symbol"] },
        strict: true
      },
      { name: "ping", input_schema: { type: "object", properties: {} } }
    ])
    assert.deepStrictEqual(body.tool_choice, { type: "tool", name: "get_quote" })
    assert.deepStrictEqual(body.stop_sequences, ["END"])
    assert.deepStrictEqual(body.output_format, { type: "json_schema", schema: { type: "object" } })
    assert.strictEqual(body.temperature, 1)
    for (const key of ["routing", "include_reasoning", "seed", "context", "user"])
      assert.notProperty(body, key)
  })

  it("maps tool_choice strings", () => {
    const choice = (tool_choice: unknown) =>
      chatRequestToMessagesRequest({ ...base, tool_choice }, "c", 100).tool_choice
    assert.deepStrictEqual(choice("auto"), { type: "auto" })
    assert.deepStrictEqual(choice("none"), { type: "none" })
    assert.deepStrictEqual(choice("required"), { type: "any" })
    assert.strictEqual(choice(undefined), undefined)
  })

  it("turns reasoning_effort into a thinking budget below max_tokens, and drops what thinking forbids", () => {
    const thinking = (request: Partial<ChatCompletionRequest>, maxTokens: number) =>
      chatRequestToMessagesRequest({ ...base, ...request }, "c", maxTokens)
    assert.deepStrictEqual(thinking({ reasoning_effort: "medium" }, 64_000).thinking, {
      type: "enabled",
      budget_tokens: 8192
    })
    assert.deepStrictEqual(thinking({ reasoning_effort: "high" }, 4096).thinking, {
      type: "enabled",
      budget_tokens: 4095
    })
    assert.isUndefined(thinking({ reasoning_effort: "low" }, 1024).thinking)
    assert.isUndefined(thinking({ reasoning_effort: "none" }, 64_000).thinking)
    assert.isUndefined(thinking({}, 64_000).thinking)
    const withSampling = thinking({ reasoning_effort: "low", temperature: 0.2, top_p: 0.5 }, 8000)
    assert.isDefined(withSampling.thinking)
    assert.notProperty(withSampling, "temperature")
    assert.notProperty(withSampling, "top_p")
    assert.isUndefined(thinking({ reasoning_effort: "low", tool_choice: "required" }, 8000).thinking)
  })

  it("merges tool results and the following user text into one user turn", () => {
    const { turns } = chatMessagesToTurns([
      { role: "user", content: "weather?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "a", arguments: '{"x":1}' } },
          { id: "call_2", type: "function", function: { name: "b", arguments: "not json" } }
        ]
      },
      { role: "tool", tool_call_id: "call_1", content: "sunny" },
      { role: "tool", tool_call_id: "call_2", content: [{ type: "text", text: "windy" }] },
      { role: "user", content: "thanks" }
    ])
    assert.deepStrictEqual(turns, [
      { role: "user", content: [{ type: "text", text: "weather?" }] },
      {
        role: "assistant",
        content: [
          { type: "tool_use", id: "call_1", name: "a", input: { x: 1 } },
          { type: "tool_use", id: "call_2", name: "b", input: {} }
        ]
      },
      {
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "call_1", content: "sunny" },
          { type: "tool_result", tool_use_id: "call_2", content: "windy" },
          { type: "text", text: "thanks" }
        ]
      }
    ])
  })
})

// ---------------------------------------------------------------------------------------------
// The Messages event stream

type BlockSpec =
  | { readonly kind: "text" | "thinking"; readonly pieces: ReadonlyArray<string> }
  | {
      readonly kind: "tool"
      readonly id: string
      readonly name: string
      readonly json: string
      readonly cuts: ReadonlyArray<number>
    }

const pieces = fc.array(fc.string({ minLength: 1, maxLength: 8 }), { minLength: 1, maxLength: 5 })
const blockSpec: fc.Arbitrary<BlockSpec> = fc.oneof(
  fc.record({ kind: fc.constantFrom("text" as const, "thinking" as const), pieces }),
  fc.record({
    kind: fc.constant("tool" as const),
    id: fc.stringMatching(/^toolu_[a-z0-9]{1,8}$/),
    name: fc.stringMatching(/^[a-z_]{1,10}$/),
    json: fc
      .dictionary(fc.string({ maxLength: 6 }), fc.jsonValue({ maxDepth: 2 }))
      .map((o) => JSON.stringify(o)),
    cuts: fc.array(fc.nat(), { maxLength: 6 })
  })
)

const cutString = (s: string, cuts: ReadonlyArray<number>): Array<string> => {
  const points = [...new Set(cuts.map((c) => c % (s.length + 1)))].sort((a, b) => a - b)
  const out: Array<string> = []
  let start = 0
  for (const p of [...points, s.length]) {
    if (p > start) out.push(s.slice(start, p))
    start = p
  }
  return out
}

const messagesEvents = (
  blocks: ReadonlyArray<BlockSpec>,
  usage: { readonly input: number; readonly cacheRead: number; readonly output: number },
  stopReason: string
): Array<AnthropicStreamEvent> => {
  const events: Array<AnthropicStreamEvent> = [
    {
      type: "message_start",
      message: {
        usage: { input_tokens: usage.input, cache_read_input_tokens: usage.cacheRead, output_tokens: 0 }
      }
    }
  ]
  blocks.forEach((block, index) => {
    if (block.kind === "tool") {
      events.push({
        type: "content_block_start",
        index,
        content_block: { type: "tool_use", id: block.id, name: block.name }
      })
      for (const piece of cutString(block.json, block.cuts)) {
        events.push({
          type: "content_block_delta",
          index,
          delta: { type: "input_json_delta", partial_json: piece }
        })
      }
    } else {
      events.push({
        type: "content_block_start",
        index,
        content_block: { type: block.kind, [block.kind]: "" }
      })
      if (block.kind === "thinking") events.push({ type: "ping" })
      for (const piece of block.pieces) {
        events.push({
          type: "content_block_delta",
          index,
          delta:
            block.kind === "text"
              ? { type: "text_delta", text: piece }
              : { type: "thinking_delta", thinking: piece }
        })
      }
      if (block.kind === "thinking") {
        events.push({ type: "content_block_delta", index, delta: { type: "signature_delta" } })
      }
    }
    events.push({ type: "content_block_stop", index })
  })
  events.push({
    type: "message_delta",
    delta: { stop_reason: stopReason },
    usage: { output_tokens: usage.output }
  })
  events.push({ type: "message_stop" })
  return events
}

const fold = (events: ReadonlyArray<AnthropicStreamEvent>) => {
  let state: AnthropicStreamState = initialAnthropicState
  const out: Array<UpstreamEvent> = []
  let done = false
  for (const event of events) {
    assert.isFalse(done, "no event after message_stop")
    const step = anthropicEventToEvents(state, event)
    if (Result.isFailure(step)) throw step.failure
    state = step.success.state
    out.push(...step.success.events)
    done = step.success.done
  }
  assert.isTrue(done)
  return out
}

const joined = (events: ReadonlyArray<UpstreamEvent>, tag: "TextDelta" | "ReasoningDelta") =>
  events.map((e) => (e._tag === tag ? e.text : "")).join("")

const usageArb = fc.record({ input: fc.nat(5000), cacheRead: fc.nat(5000), output: fc.nat(5000) })
const stopArb = fc.constantFrom("end_turn", "stop_sequence", "max_tokens", "tool_use")
const finishFor = {
  end_turn: "stop",
  stop_sequence: "stop",
  max_tokens: "length",
  tool_use: "tool_calls"
} as const

describe("anthropicEventToEvents", () => {
  it("reassembles text, thinking and tool inputs from their deltas", () => {
    fc.assert(
      fc.property(fc.array(blockSpec, { maxLength: 6 }), usageArb, stopArb, (blocks, usage, stop) => {
        const out = fold(messagesEvents(blocks, usage, stop))
        const textBlocks = (kind: "text" | "thinking") =>
          blocks.flatMap((b) => (b.kind === kind ? b.pieces : [])).join("")
        assert.strictEqual(joined(out, "TextDelta"), textBlocks("text"))
        assert.strictEqual(joined(out, "ReasoningDelta"), textBlocks("thinking"))

        const tools = blocks.filter((b) => b.kind === "tool")
        const calls = out.filter((e) => e._tag === "ToolCallDelta")
        tools.forEach((tool, index) => {
          const mine = calls.filter((c) => c.index === index)
          assert.strictEqual(mine[0]!.id, tool.id)
          assert.strictEqual(mine[0]!.name, tool.name)
          assert.isTrue(mine.slice(1).every((c) => c.id === undefined && c.name === undefined))
          assert.strictEqual(mine.map((c) => c.argumentsDelta).join(""), tool.json)
        })
        assert.strictEqual(new Set(calls.map((c) => c.index)).size, tools.length)

        assert.deepStrictEqual(out.slice(-2), [
          { _tag: "Finish", reason: finishFor[stop] },
          {
            _tag: "Usage",
            inputTokens: usage.input + usage.cacheRead,
            outputTokens: usage.output,
            reasoningTokens: undefined,
            cachedInputTokens: usage.cacheRead
          }
        ])
      }),
      { numRuns: 300 }
    )
  })

  it("gives the same events when the stream arrives as SSE bytes cut anywhere", () => {
    const encoder = new TextEncoder()
    fc.assert(
      fc.property(
        fc.array(blockSpec, { maxLength: 4 }),
        usageArb,
        stopArb,
        fc.array(fc.nat(), { maxLength: 12 }),
        (blocks, usage, stop, cuts) => {
          const events = messagesEvents(blocks, usage, stop)
          const wire = events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join("")
          const bytes = encoder.encode(wire)
          const points = [...new Set(cuts.map((c) => c % (bytes.length + 1))), bytes.length].sort(
            (a, b) => a - b
          )
          const chunks = points.map((p, i) => bytes.subarray(i === 0 ? 0 : points[i - 1]!, p))
          const decoded = Effect.runSync(
            Stream.runCollect(decodeUpstreamStream(anthropicCodec, Stream.fromIterable(chunks)))
          )
          assert.deepStrictEqual(decoded, fold(events))
        }
      ),
      { numRuns: 150 }
    )
  })

  it("gives a tool called without arguments the arguments {}", () => {
    const out = fold([
      { type: "message_start", message: {} },
      {
        type: "content_block_start",
        index: 0,
        content_block: { type: "tool_use", id: "toolu_1", name: "now" }
      },
      { type: "content_block_stop", index: 0 },
      { type: "message_delta", delta: { stop_reason: "tool_use" }, usage: { output_tokens: 3 } },
      { type: "message_stop" }
    ])
    assert.deepStrictEqual(
      out.filter((e) => e._tag === "ToolCallDelta").map((e) => e.argumentsDelta),
      ["", "{}"]
    )
  })

  it("reports sources from message_start and fails on error events and stray deltas", () => {
    const sources = [{ id: "1", title: "T", url: "https://example.org/a", snippet: "S" }]
    const start = anthropicEventToEvents(initialAnthropicState, {
      type: "message_start",
      message: { svc_sources: [...sources, { id: 2 }] }
    })
    assert.deepStrictEqual(Result.getOrThrow(start).events, [{ _tag: "Sources", sources }])

    const error = anthropicEventToEvents(initialAnthropicState, {
      type: "error",
      error: { type: "overloaded_error", message: "Overloaded" }
    })
    assert.isTrue(Result.isFailure(error) && error.failure.reason === "provider_error")

    const stray = anthropicEventToEvents(initialAnthropicState, {
      type: "content_block_delta",
      index: 3,
      delta: { type: "text_delta", text: "x" }
    })
    assert.isTrue(Result.isFailure(stray) && stray.failure.reason === "protocol")
  })
})
