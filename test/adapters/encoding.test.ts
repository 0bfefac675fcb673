import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { citationAnnotations, isSafeExternalUrl } from "../../src/inference/adapters/Citations.ts"
import {
  type MessagesEncodeOptions,
  type MessagesEvent,
  makeMessagesEncoder,
  messagesBody
} from "../../src/inference/adapters/MessagesEncoding.ts"
import {
  makeResponsesEncoder,
  type ResponsesEncodeOptions,
  type ResponsesEvent,
  responsesBody
} from "../../src/inference/adapters/ResponsesEncoding.ts"
import { assemble } from "../../src/inference/ChatEncoding.ts"
import type { FinishReason, UpstreamSource } from "../../src/inference/Events.ts"
import type { ServeEvent, ServeSummary } from "../../src/inference/Paid.ts"

// ---------------------------------------------------------------------------------------------
// Served event sequences as Serve emits them: content deltas, then one End.

type Segment =
  | { readonly kind: "text"; readonly pieces: ReadonlyArray<string> }
  | { readonly kind: "reasoning"; readonly pieces: ReadonlyArray<string> }
  | { readonly kind: "tool"; readonly name: string; readonly pieces: ReadonlyArray<string> }

const pieces = fc.array(fc.string({ minLength: 1, maxLength: 6 }), { minLength: 1, maxLength: 5 })
const segment: fc.Arbitrary<Segment> = fc.oneof(
  pieces.map((p) => ({ kind: "text" as const, pieces: p })),
  pieces.map((p) => ({ kind: "reasoning" as const, pieces: p })),
  fc.record({
    kind: fc.constant("tool" as const),
    name: fc.stringMatching(/^[a-z_]{1,8}$/),
    pieces: fc.array(fc.string({ maxLength: 6 }), { maxLength: 5 })
  })
)

const summaryOf = (status: ServeSummary["status"], finishReason: FinishReason | null): ServeSummary => ({
  status,
  finishReason,
  providerId: "sim-x",
  modelClass: "chat-medium",
  usage: {
    promptTokens: 11,
    completionTokens: 7,
    reasoningTokens: 2,
    cachedTokens: 3,
    estimated: { prompt: false, completion: false, reasoning: true }
  },
  charged: 123,
  authorized: 456,
  ttftMs: 10,
  error: status === "partial" ? { code: "upstream_dropped", message: "the provider failed" } : null
})

const finish = fc.oneof(
  fc.constant(summaryOf("ok", "stop")),
  fc.constant(summaryOf("ok", "tool_calls")),
  fc.constant(summaryOf("ok", "length")),
  fc.constant(summaryOf("partial", null))
)

const served = (segments: ReadonlyArray<Segment>, summary: ServeSummary): Array<ServeEvent> => {
  const events: Array<ServeEvent> = []
  let toolIndex = 0
  for (const s of segments) {
    if (s.kind === "tool") {
      const index = toolIndex++
      s.pieces.forEach((argumentsDelta, i) => {
        events.push({
          _tag: "Delta",
          event: {
            _tag: "ToolCallDelta",
            index,
            ...(i === 0 ? { id: `call_${index}`, name: s.name } : {}),
            argumentsDelta
          }
        })
      })
      if (s.pieces.length === 0) {
        events.push({
          _tag: "Delta",
          event: { _tag: "ToolCallDelta", index, id: `call_${index}`, name: s.name, argumentsDelta: "" }
        })
      }
    } else {
      for (const text of s.pieces) {
        events.push({
          _tag: "Delta",
          event: { _tag: s.kind === "text" ? "TextDelta" : "ReasoningDelta", text }
        })
      }
    }
  }
  events.push({ _tag: "End", summary })
  return events
}

// ---------------------------------------------------------------------------------------------
// Responses

const responsesOptions = (showReasoning: boolean): ResponsesEncodeOptions => ({
  requestId: "req_abc",
  createdAt: 1_700_000_000_000,
  model: "chat-medium",
  showReasoning,
  echo: { tools: [] },
  svcCleared: { type: "auction_cleared" },
  svcFinal: (s) => ({ request_id: "req_abc", selected: s.modelClass })
})

const encodeResponses = (options: ResponsesEncodeOptions, events: ReadonlyArray<ServeEvent>) => {
  const encoder = makeResponsesEncoder(options)
  return [...encoder.start(), ...events.flatMap((e) => encoder.push(e))]
}

const field = <A>(event: ResponsesEvent, key: string) => event[key] as A
type OutputItem = {
  type: string
  id: string
  call_id?: string
  name?: string
  arguments?: string
  content?: Array<{ type: string; text: string }>
}

describe("the Responses encoder", () => {
  it("deltas and the final response both reassemble to the served content (property)", () => {
    fc.assert(
      fc.property(fc.array(segment, { maxLength: 8 }), finish, fc.boolean(), (segments, summary, show) => {
        const events = served(segments, summary)
        const assembled = assemble(events)
        const out = encodeResponses(responsesOptions(show), events)
        const of = (type: string) => out.filter((e) => e.type === type)

        assert.deepStrictEqual(
          out.map((e) => e.sequence_number),
          out.map((_, i) => i)
        )
        assert.strictEqual(out[0]!.type, "response.created")
        assert.strictEqual(out[1]!.type, "response.in_progress")
        assert.strictEqual(
          of("response.output_text.delta")
            .map((e) => field<string>(e, "delta"))
            .join(""),
          assembled.text
        )
        const reasoning = of("response.reasoning_text.delta")
          .map((e) => field<string>(e, "delta"))
          .join("")
        assert.strictEqual(reasoning, show ? assembled.reasoning : "")

        const last = out.at(-1)!
        const expectedEnd =
          summary.status === "partial"
            ? "response.failed"
            : summary.finishReason === "length"
              ? "response.incomplete"
              : "response.completed"
        assert.strictEqual(last.type, expectedEnd)
        const response = field<{ output: Array<OutputItem>; usage: { total_tokens: number } }>(
          last,
          "response"
        )
        assert.strictEqual(response.usage.total_tokens, 18)
        assert.deepStrictEqual(response, responsesBody(responsesOptions(show), events))
        const messageText = response.output
          .filter((o) => o.type === "message")
          .flatMap((o) => o.content!.map((c) => c.text))
          .join("")
        assert.strictEqual(messageText, assembled.text)
        const calls = response.output.filter((o) => o.type === "function_call")
        assert.deepStrictEqual(
          calls.map((c) => [c.call_id, c.name, c.arguments]),
          assembled.toolCalls.map((c) => [c.id, c.function.name, c.function.arguments])
        )
        for (const call of calls) {
          const streamed = of("response.function_call_arguments.delta")
            .filter((e) => e.item_id === call.id)
            .map((e) => field<string>(e, "delta"))
            .join("")
          assert.strictEqual(streamed, call.arguments)
        }

        // Every item is added once and done once, and nothing is said about it after it is done.
        const added = of("response.output_item.added").map((e) => field<number>(e, "output_index"))
        const done = of("response.output_item.done").map((e) => field<number>(e, "output_index"))
        assert.deepStrictEqual([...done].sort(), [...added].sort())
        assert.deepStrictEqual(
          added,
          response.output.map((_, i) => i)
        )
        for (const index of added) {
          const doneAt = out.findIndex(
            (e) => e.type === "response.output_item.done" && e.output_index === index
          )
          assert.isFalse(out.slice(doneAt + 1).some((e) => e.output_index === index))
        }
      }),
      { numRuns: 400 }
    )
  })

  it("projects citations into annotations, announced after text.done and before content_part.done", () => {
    const sources: Array<UpstreamSource> = [
      { id: "1", title: "One", url: "https://example.org/one", snippet: "s" },
      { id: "2", title: "Private", url: "http://10.0.0.1/x", snippet: "s" }
    ]
    const events: Array<ServeEvent> = [
      { _tag: "Delta", event: { _tag: "Sources", sources } },
      { _tag: "Delta", event: { _tag: "TextDelta", text: "Fact [1]. Other [2]. Unknown [9]." } },
      { _tag: "End", summary: summaryOf("ok", "stop") }
    ]
    const out = encodeResponses(responsesOptions(false), events)
    const types = out.map((e) => e.type)
    const annotationAt = types.indexOf("response.output_text.annotation.added")
    assert.isAbove(annotationAt, types.indexOf("response.output_text.done"))
    assert.isBelow(annotationAt, types.indexOf("response.content_part.done"))
    assert.strictEqual(types.filter((t) => t === "response.output_text.annotation.added").length, 1)
    const annotation = field<{ start_index: number; end_index: number; url: string }>(
      out[annotationAt]!,
      "annotation"
    )
    assert.deepStrictEqual(annotation, {
      type: "url_citation",
      start_index: 5,
      end_index: 8,
      url: "https://example.org/one",
      title: "One"
    } as typeof annotation)
    const body = responsesBody(responsesOptions(false), events) as {
      svc_sources: unknown
      output: Array<OutputItem>
    }
    assert.deepStrictEqual(body.svc_sources, sources)
  })
})

// ---------------------------------------------------------------------------------------------
// Messages

const messagesOptions = (showThinking: boolean): MessagesEncodeOptions => ({
  requestId: "req_abc",
  model: "chat-large",
  showThinking,
  inputTokensEstimate: 9,
  svcCleared: { type: "auction_cleared" },
  svcFinal: (s) => ({ charged: s.charged }),
  svcUsage: (s) => ({ type: "usage", charged: s.charged })
})

const encodeMessages = (options: MessagesEncodeOptions, events: ReadonlyArray<ServeEvent>) => {
  const encoder = makeMessagesEncoder(options)
  return [...encoder.start(), ...events.flatMap((e) => encoder.push(e))]
}

type Delta = { type: string; text?: string; thinking?: string; partial_json?: string }

describe("the Messages encoder", () => {
  it("the event stream and the final message both reassemble to the served content (property)", () => {
    fc.assert(
      fc.property(fc.array(segment, { maxLength: 8 }), finish, fc.boolean(), (segments, summary, show) => {
        const events = served(segments, summary)
        const assembled = assemble(events)
        const out: ReadonlyArray<MessagesEvent> = encodeMessages(messagesOptions(show), events)
        assert.strictEqual(out[0]!.type, "svc.auction_cleared")
        assert.strictEqual(out[1]!.type, "message_start")
        const deltas = out.filter((e) => e.type === "content_block_delta").map((e) => e.delta as Delta)
        assert.strictEqual(deltas.map((d) => d.text ?? "").join(""), assembled.text)
        assert.strictEqual(deltas.map((d) => d.thinking ?? "").join(""), show ? assembled.reasoning : "")
        assert.strictEqual(
          deltas.map((d) => d.partial_json ?? "").join(""),
          assembled.toolCalls.map((c) => c.function.arguments).join("")
        )

        // Blocks open in index order, one at a time, each stopped once before the next starts.
        let open: number | undefined
        let next = 0
        for (const e of out) {
          if (e.type === "content_block_start") {
            assert.isUndefined(open)
            assert.strictEqual(e.index, next++)
            open = e.index as number
          } else if (e.type === "content_block_delta") {
            assert.strictEqual(e.index, open)
          } else if (e.type === "content_block_stop") {
            assert.strictEqual(e.index, open)
            open = undefined
          }
        }
        assert.isUndefined(open)

        if (summary.status === "partial") {
          assert.strictEqual(out.at(-1)!.type, "error")
          return
        }
        assert.deepStrictEqual(
          out.slice(-2).map((e) => e.type),
          ["message_delta", "message_stop"]
        )
        const delta = out.at(-2)!
        assert.deepStrictEqual(delta.usage, {
          input_tokens: 8,
          output_tokens: 7,
          cache_creation_input_tokens: 0,
          cache_read_input_tokens: 3
        })
        const stop = (delta.delta as { stop_reason: string }).stop_reason
        assert.strictEqual(
          stop,
          summary.finishReason === "tool_calls"
            ? "tool_use"
            : summary.finishReason === "length"
              ? "max_tokens"
              : "end_turn"
        )

        const message = messagesBody(messagesOptions(show), events) as {
          content: Array<{ type: string; text?: string; thinking?: string; id?: string; input?: unknown }>
          stop_reason: string
        }
        assert.strictEqual(message.stop_reason, stop)
        assert.strictEqual(message.content.map((b) => b.text ?? "").join(""), assembled.text)
        assert.strictEqual(
          message.content.filter((b) => b.type === "thinking").length > 0,
          show && assembled.reasoning !== ""
        )
        assert.deepStrictEqual(
          message.content.filter((b) => b.type === "tool_use").map((b) => b.id),
          assembled.toolCalls.map((c) => c.id)
        )
      }),
      { numRuns: 400 }
    )
  })

  it("tool_use input is the parsed arguments; grounding rides on message_start", () => {
    const sources: Array<UpstreamSource> = [{ id: "1", title: "t", url: "https://example.org", snippet: "s" }]
    const events: Array<ServeEvent> = [
      { _tag: "Delta", event: { _tag: "Sources", sources } },
      {
        _tag: "Delta",
        event: { _tag: "ToolCallDelta", index: 0, id: "toolu_1", name: "f", argumentsDelta: '{"a":' }
      },
      { _tag: "Delta", event: { _tag: "ToolCallDelta", index: 0, argumentsDelta: "1}" } },
      { _tag: "End", summary: summaryOf("ok", "tool_calls") }
    ]
    const out = encodeMessages(messagesOptions(false), events)
    const start = out.find((e) => e.type === "message_start")!
    assert.deepStrictEqual((start.message as { svc_sources: unknown }).svc_sources, sources)
    const message = messagesBody(messagesOptions(false), events)
    assert.deepStrictEqual(message.content, [{ type: "tool_use", id: "toolu_1", name: "f", input: { a: 1 } }])
  })
})

// ---------------------------------------------------------------------------------------------
// Citations

describe("citation projection", () => {
  it("only known sources with safe URLs become citations, at the marker's character range (property)", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(
            fc.string(),
            fc.integer({ min: 0, max: 9 }).map((n) => `[${n}]`),
            fc.constant("🚀")
          ),
          {
            maxLength: 12
          }
        ),
        fc.subarray(["1", "2", "3", "4"]),
        (parts, ids) => {
          const text = parts.join("")
          const sources = ids.map((id) => ({ id, title: id, url: `https://example.org/${id}`, snippet: "" }))
          const annotations = citationAnnotations(text, sources)
          const chars = Array.from(text)
          for (const a of annotations) {
            const marker = chars.slice(a.start_index, a.end_index).join("")
            assert.match(marker, /^\[\d+\]$/)
            assert.include(ids, marker.slice(1, -1))
            assert.strictEqual(a.url, `https://example.org/${marker.slice(1, -1)}`)
          }
          const expected = [...text.matchAll(/\[(\d{1,4})\]/g)].filter((m) => ids.includes(m[1]!)).length
          assert.strictEqual(annotations.length, expected)
        }
      ),
      { numRuns: 300 }
    )
  })

  it("validates external URLs: scheme, credentials, private and local hosts", () => {
    for (const url of ["https://example.org/a", "http://news.example.com:8080/x?y=1", "https://8.8.8.8/"]) {
      assert.isTrue(isSafeExternalUrl(url), url)
    }
    for (const url of [
      "javascript:alert(1)",
      "ftp://example.org/",
      "https://user:pw@example.org/",
      "http://localhost:3000/",
      "http://127.0.0.1/",
      "http://10.1.2.3/",
      "http://192.168.0.1/",
      "http://172.20.0.1/",
      "http://169.254.169.254/latest",
      "http://[::1]/",
      "http://[fd00::1]/",
      "https://printer.local/",
      "https://intranet/",
      "not a url"
    ]) {
      assert.isFalse(isSafeExternalUrl(url), url)
    }
  })
})
