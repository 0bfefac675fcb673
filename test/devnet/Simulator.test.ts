import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import {
  isTokenPiece,
  markersFor,
  reasoningText,
  replyText,
  type SimRequest,
  simulate,
  toolCalls
} from "../../src/devnet/fleet/Simulator.ts"

const request = (overrides: Partial<SimRequest> = {}): SimRequest => ({
  modelClass: "chat-medium",
  messages: [{ role: "user", text: "Tell me about standing quotes." }],
  lastUserText: "Tell me about standing quotes.",
  maxTokens: 4096,
  reasoning: undefined,
  tools: [],
  toolChoice: { _tag: "Auto" },
  toolResultPending: false,
  responseFormat: { _tag: "Text" },
  ...overrides
})

const weatherTool = {
  name: "get_weather",
  parameters: {
    type: "object",
    properties: {
      city: { type: "string" },
      days: { type: "integer" },
      metric: { type: "boolean" },
      unit: { type: "string", enum: ["c", "f"] },
      optional_note: { type: "string" }
    },
    required: ["city", "days", "metric", "unit"]
  }
}

describe("Simulator", () => {
  it("derives the same reply from the same prompt, and a different one from another prompt", () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1, maxLength: 200 }), fc.string({ minLength: 1 }), (a, b) => {
        fc.pre(a !== b)
        const one = simulate(request({ messages: [{ role: "user", text: a }] }), { multiTool: false })
        const two = simulate(request({ messages: [{ role: "user", text: a }] }), { multiTool: false })
        assert.deepStrictEqual(one, two)
        const other = simulate(request({ messages: [{ role: "user", text: b }] }), { multiTool: false })
        assert.notStrictEqual(replyText(other.pieces), replyText(one.pieces))
      })
    )
  })

  it("never produces more completion tokens than max_tokens and counts every token piece", () => {
    fc.assert(
      fc.property(
        fc.string(),
        fc.integer({ min: 0, max: 200 }),
        fc.option(fc.integer({ min: 1, max: 100 }), { nil: undefined }),
        (text, maxTokens, budget) => {
          const base = request({
            messages: [{ role: "user", text }],
            reasoning: budget === undefined ? undefined : { budgetTokens: budget }
          })
          const reply = simulate({ ...base, maxTokens }, { multiTool: false })
          assert.isAtMost(reply.completionTokens, maxTokens)
          assert.strictEqual(reply.completionTokens, reply.pieces.filter(isTokenPiece).length)
          assert.strictEqual(reply.reasoningTokens, reply.pieces.filter((p) => p._tag === "Reasoning").length)
          if (budget !== undefined) assert.isAtMost(reply.reasoningTokens, budget)
          const natural = simulate({ ...base, maxTokens: 100_000 }, { multiTool: false })
          assert.deepStrictEqual(reply.pieces, natural.pieces.slice(0, reply.pieces.length))
          assert.strictEqual(
            reply.finishReason,
            reply.completionTokens < natural.completionTokens ? "length" : natural.finishReason
          )
        }
      )
    )
  })

  it("produces reasoning only when asked, before the answer", () => {
    const plain = simulate(request(), { multiTool: false })
    assert.strictEqual(plain.reasoningTokens, 0)
    const reasoned = simulate(request({ reasoning: { budgetTokens: 64 } }), { multiTool: false })
    assert.isAbove(reasoned.reasoningTokens, 0)
    assert.isAbove(reasoningText(reasoned.pieces).length, 0)
    const firstText = reasoned.pieces.findIndex((p) => p._tag === "Text")
    const lastReasoning = reasoned.pieces.findLastIndex((p) => p._tag === "Reasoning")
    assert.isBelow(lastReasoning, firstText)
    assert.strictEqual(reasoned.completionTokens, reasoned.reasoningTokens + replyPieces(reasoned))
  })

  it("calls the first tool with arguments filling every required property by type", () => {
    const reply = simulate(request({ tools: [weatherTool, { name: "other", parameters: {} }] }), {
      multiTool: false
    })
    assert.strictEqual(reply.finishReason, "tool_calls")
    const calls = toolCalls(reply.pieces)
    assert.strictEqual(calls.length, 1)
    assert.strictEqual(calls[0]!.name, "get_weather")
    const args = JSON.parse(calls[0]!.arguments)
    assert.strictEqual(typeof args.city, "string")
    assert.strictEqual(args.days, 1)
    assert.strictEqual(args.metric, true)
    assert.strictEqual(args.unit, "c")
    assert.notProperty(args, "optional_note")
    assert.isAbove(reply.pieces.filter((p) => p._tag === "ToolCallArguments").length, 1)
  })

  it("calls several tools with the multi-tool marker, and none once a tool result is pending", () => {
    const tools = [weatherTool, { name: "lookup", parameters: { type: "object", properties: {} } }]
    const multi = simulate(request({ tools }), { multiTool: true })
    assert.deepStrictEqual(
      toolCalls(multi.pieces).map((c) => c.name),
      ["get_weather", "lookup"]
    )
    const answered = simulate(request({ tools, toolResultPending: true }), { multiTool: true })
    assert.strictEqual(toolCalls(answered.pieces).length, 0)
    assert.strictEqual(answered.finishReason, "stop")
    const none = simulate(request({ tools, toolChoice: { _tag: "None" } }), { multiTool: false })
    assert.strictEqual(toolCalls(none.pieces).length, 0)
    const named = simulate(request({ tools, toolChoice: { _tag: "Named", name: "lookup" } }), {
      multiTool: false
    })
    assert.deepStrictEqual(
      toolCalls(named.pieces).map((c) => c.name),
      ["lookup"]
    )
  })

  it("answers a JSON schema with an object holding its required properties", () => {
    const schema = {
      type: "object",
      properties: {
        title: { type: "string" },
        score: { type: "number" },
        tags: { type: "array", items: { type: "string" } },
        nested: { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"] }
      },
      required: ["title", "score", "tags", "nested"],
      additionalProperties: false
    }
    const reply = simulate(request({ responseFormat: { _tag: "JsonSchema", schema } }), { multiTool: false })
    const value = JSON.parse(replyText(reply.pieces))
    assert.strictEqual(typeof value.title, "string")
    assert.strictEqual(value.score, 1)
    assert.isTrue(Array.isArray(value.tags) && typeof value.tags[0] === "string")
    assert.deepStrictEqual(value.nested, { ok: true })
    const object = simulate(request({ responseFormat: { _tag: "JsonObject" } }), { multiTool: false })
    assert.strictEqual(typeof JSON.parse(replyText(object.pieces)).answer, "string")
  })

  it("gives grounded replies sources and [n] markers that all name a source", () => {
    const reply = simulate(request({ modelClass: "grounded-medium" }), { multiTool: false })
    assert.strictEqual(reply.sources.length, 3)
    for (const source of reply.sources) assert.match(source.url, /^https:\/\/example\.org\//)
    const cited = [...replyText(reply.pieces).matchAll(/\[(\d+)\]/g)].map((m) => m[1])
    assert.isAbove(cited.length, 0)
    const ids = new Set(reply.sources.map((s) => s.id))
    for (const id of cited) assert.isTrue(ids.has(id!))
    assert.strictEqual(simulate(request(), { multiTool: false }).sources.length, 0)
  })

  it("[[sim:long]] makes a reply as long as max_tokens allows", () => {
    const long = simulate({ ...request(), maxTokens: 1_000 }, { multiTool: false, long: true })
    assert.strictEqual(long.completionTokens, 1_000)
    assert.strictEqual(long.finishReason, "length")
  })

  it("scopes markers to one provider when asked", () => {
    const text = "hi [[sim:error@sim-openai-1]] [[sim:slow]] [[sim:multi-tool]]"
    assert.deepStrictEqual(markersFor(text, "sim-openai-1"), {
      slow: true,
      error: true,
      drop: false,
      multiTool: true,
      long: false
    })
    assert.deepStrictEqual(markersFor(text, "sim-openai-2"), {
      slow: true,
      error: false,
      drop: false,
      multiTool: true,
      long: false
    })
  })

  it("counts prompt tokens over every message, special-token text included", () => {
    const one = simulate(request({ messages: [{ role: "user", text: "hello world" }] }), { multiTool: false })
    const two = simulate(
      request({
        messages: [
          { role: "system", text: "be brief <|endoftext|>" },
          { role: "user", text: "hello world" }
        ]
      }),
      { multiTool: false }
    )
    assert.isAbove(one.promptTokens, 0)
    assert.isAbove(two.promptTokens, one.promptTokens)
  })
})

const replyPieces = (reply: ReturnType<typeof simulate>) =>
  reply.pieces.filter((p) => p._tag === "Text").length
