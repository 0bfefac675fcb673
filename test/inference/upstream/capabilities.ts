import { assert } from "@effect/vitest"
import { Exit } from "effect"
import type { ChatCompletionRequest, FunctionTool } from "../../../src/domain/Chat.ts"
import type { UpstreamEvent } from "../../../src/inference/Events.ts"
import type { UpstreamDialect } from "../../../src/inference/upstream/Upstream.ts"
import type { UpstreamError } from "../../../src/inference/upstream/UpstreamError.ts"

/**
 * The capability cases every upstream dialect must pass (tensorzero style): each names a request and
 * what the dialect-neutral event stream of its reply must show. The suite runs the same table for
 * the OpenAI-dialect and the Anthropic-dialect simulated provider.
 */

export interface Run {
  readonly events: ReadonlyArray<UpstreamEvent>
  readonly exit: Exit.Exit<void, UpstreamError>
}

export interface CapabilityCase {
  readonly name: string
  readonly request: ChatCompletionRequest
  readonly modelClass?: string
  /**
   * Whether both dialects read the same reply (text, reasoning, tool calls, usage, sources). Not so
   * where the provider sees the conversation differently (a tool result rides in a user turn of the
   * Messages dialect), nor for faults.
   */
  readonly parity: boolean
  readonly check: (run: Run, dialect: UpstreamDialect) => void
}

/** Event kinds with runs of one kind collapsed: the shape of a reply. */
export const kinds = (events: ReadonlyArray<UpstreamEvent>) =>
  events.map((e) => e._tag).filter((tag, i, all) => i === 0 || all[i - 1] !== tag)

export const textOf = (events: ReadonlyArray<UpstreamEvent>, tag: "TextDelta" | "ReasoningDelta") =>
  events.map((e) => (e._tag === tag ? e.text : "")).join("")

export const usageOf = (events: ReadonlyArray<UpstreamEvent>) => {
  const usage = events.findLast((e) => e._tag === "Usage")
  assert.isDefined(usage)
  return usage?._tag === "Usage" ? usage : undefined
}

export const toolCallsOf = (events: ReadonlyArray<UpstreamEvent>) => {
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
export const tokenPieces = (events: ReadonlyArray<UpstreamEvent>) =>
  events.filter(
    (e) =>
      e._tag === "TextDelta" ||
      e._tag === "ReasoningDelta" ||
      (e._tag === "ToolCallDelta" && e.argumentsDelta !== "")
  ).length

export const failure = (exit: Exit.Exit<void, UpstreamError>) => {
  assert.isTrue(Exit.isFailure(exit), "the stream should fail")
  return Exit.isFailure(exit) ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error : undefined
}

export const ask = (content: string, extra: Partial<ChatCompletionRequest> = {}): ChatCompletionRequest => ({
  model: "auto",
  messages: [
    { role: "system", content: "You are terse." },
    { role: "user", content }
  ],
  ...extra
})

export const tools: ReadonlyArray<typeof FunctionTool.Type> = [
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

const cityJson = {
  type: "object",
  properties: { city: { type: "string" }, population: { type: "integer" } },
  required: ["city", "population"]
}

/** A tool result fed back: the conversation after a first `get_quote` call. */
const toolResultTurn = ask("Quote ACME.", {
  tools,
  messages: [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Quote ACME." },
    {
      role: "assistant",
      content: null,
      tool_calls: [
        {
          id: "call_1",
          type: "function",
          function: { name: "get_quote", arguments: '{"symbol":"ACME","size":1}' }
        }
      ]
    },
    { role: "tool", tool_call_id: "call_1", content: '{"price": 101}' }
  ]
})

const succeeded = (run: Run) => assert.isTrue(Exit.isSuccess(run.exit), String(run.exit))

export const capabilityCases: ReadonlyArray<CapabilityCase> = [
  {
    name: "streams text, then the finish reason, then usage that counts every token",
    request: ask("Explain a second-score auction."),
    parity: true,
    check: (run) => {
      succeeded(run)
      assert.deepStrictEqual(kinds(run.events), ["TextDelta", "Finish", "Usage"])
      assert.deepStrictEqual(
        run.events.find((e) => e._tag === "Finish"),
        { _tag: "Finish", reason: "stop" }
      )
      assert.isAbove(run.events.filter((e) => e._tag === "TextDelta").length, 5)
      assert.strictEqual(usageOf(run.events)?.outputTokens, tokenPieces(run.events))
      assert.isAbove(usageOf(run.events)?.inputTokens ?? 0, 0)
    }
  },
  {
    name: "streams reasoning before the answer",
    request: ask("Think, then answer.", { reasoning_effort: "high" }),
    parity: true,
    check: (run, dialect) => {
      succeeded(run)
      assert.deepStrictEqual(kinds(run.events), ["ReasoningDelta", "TextDelta", "Finish", "Usage"])
      assert.strictEqual(usageOf(run.events)?.outputTokens, tokenPieces(run.events))
      assert.isAbove(textOf(run.events, "ReasoningDelta").length, 0)
      // The chat dialect counts reasoning; the Messages dialect does not say (the router estimates).
      if (dialect === "openai") {
        assert.strictEqual(
          usageOf(run.events)?.reasoningTokens,
          run.events.filter((e) => e._tag === "ReasoningDelta").length
        )
      } else {
        assert.isUndefined(usageOf(run.events)?.reasoningTokens)
      }
    }
  },
  {
    name: "streams several tool calls with arguments in pieces",
    request: ask("Check the book. [[sim:multi-tool]]", { tools }),
    parity: true,
    check: (run, dialect) => {
      succeeded(run)
      assert.deepStrictEqual(kinds(run.events), ["ToolCallDelta", "Finish", "Usage"])
      assert.deepStrictEqual(
        run.events.find((e) => e._tag === "Finish"),
        { _tag: "Finish", reason: "tool_calls" }
      )
      assert.strictEqual(usageOf(run.events)?.outputTokens, tokenPieces(run.events))
      const calls = toolCallsOf(run.events)
      assert.deepStrictEqual(
        calls.map((c) => c.name),
        ["get_quote", "cancel_order", "list_fills"]
      )
      for (const call of calls) {
        assert.isAbove(call.pieces, 1)
        assert.isObject(JSON.parse(call.arguments))
        assert.isTrue(call.id.startsWith(dialect === "openai" ? "call_" : "toolu_"))
      }
      assert.hasAllKeys(JSON.parse(calls[0]!.arguments), ["symbol", "size"])
    }
  },
  {
    name: "answers in text once the conversation ends with a tool result",
    request: toolResultTurn,
    parity: false,
    check: (run) => {
      succeeded(run)
      assert.deepStrictEqual(kinds(run.events), ["TextDelta", "Finish", "Usage"])
    }
  },
  {
    name: "streams JSON that follows the response format's schema",
    request: ask("A city, as JSON.", {
      response_format: { type: "json_schema", json_schema: { name: "city", schema: cityJson } }
    }),
    parity: true,
    check: (run) => {
      succeeded(run)
      assert.hasAllKeys(JSON.parse(textOf(run.events, "TextDelta")), ["city", "population"])
    }
  },
  {
    name: "reports grounded sources first",
    request: ask("What happened in the market?"),
    modelClass: "grounded-medium",
    parity: true,
    check: (run) => {
      succeeded(run)
      assert.deepStrictEqual(kinds(run.events), ["Sources", "TextDelta", "Finish", "Usage"])
      const sources = run.events[0]
      assert.isTrue(sources?._tag === "Sources" && sources.sources.length === 3)
      assert.include(textOf(run.events, "TextDelta"), "[1]")
    }
  },
  {
    name: "[[sim:error]] fails with http_status before any event",
    request: ask("Hello [[sim:error]]"),
    parity: false,
    check: (run) => {
      assert.deepStrictEqual(run.events, [])
      const error = failure(run.exit)
      assert.strictEqual(error?.reason, "http_status")
      assert.strictEqual(error?.status, 500)
      assert.include(error?.excerpt ?? "", "simulated upstream failure")
    }
  },
  {
    name: "[[sim:drop]] delivers a few tokens, then fails with dropped",
    request: ask("Hello [[sim:drop]]"),
    parity: false,
    check: (run) => {
      const texts = run.events.filter((e) => e._tag === "TextDelta")
      assert.isAtLeast(texts.length, 1)
      assert.isAtMost(texts.length, 3)
      assert.isFalse(run.events.some((e) => e._tag === "Finish"))
      assert.strictEqual(failure(run.exit)?.reason, "dropped")
    }
  }
]
