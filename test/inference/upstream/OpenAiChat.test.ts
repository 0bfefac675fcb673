import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Stream } from "effect"
import fc from "fast-check"
import type { ChatCompletionRequest } from "../../../src/domain/Chat.ts"
import type { UpstreamEvent } from "../../../src/inference/Events.ts"
import { chatRequestToUpstream, openAiChunkToEvents } from "../../../src/inference/upstream/OpenAiChat.ts"
import { promptTexts, redactExcerpt } from "../../../src/inference/upstream/Redact.ts"
import {
  anthropicCodec,
  type DialectCodec,
  decodeUpstreamStream,
  openAiCodec
} from "../../../src/inference/upstream/Upstream.ts"

const request: ChatCompletionRequest = {
  model: "auto",
  messages: [{ role: "user", content: "hi" }],
  max_tokens: 99,
  stream: false,
  stream_options: { include_usage: false },
  include_reasoning: true,
  reasoning_effort: "low",
  routing: { session_id: "s1", task: "code" },
  context: { passport: "p" },
  tool_choice: "auto",
  response_format: { type: "json_object" },
  temperature: 0.3,
  top_p: 0.9,
  stop: ["\n\n"],
  seed: 42,
  user: "end-user-7"
}

describe("chat request to an OpenAI-compatible upstream", () => {
  it("sends the class id, streams with usage, and strips router-only fields", () => {
    const body = chatRequestToUpstream(request, "chat-medium", 512)
    assert.deepStrictEqual(body, {
      model: "chat-medium",
      messages: request.messages,
      max_completion_tokens: 512,
      stream: true,
      stream_options: { include_usage: true },
      tool_choice: "auto",
      response_format: { type: "json_object" },
      reasoning_effort: "low",
      temperature: 0.3,
      top_p: 0.9,
      stop: ["\n\n"],
      seed: 42
    })
  })
})

describe("openAiChunkToEvents", () => {
  it("reads content, both reasoning spellings, tool call pieces, finish, usage and sources", () => {
    const sources = [{ id: "1", title: "A", url: "https://example.org/a", snippet: "s" }]
    assert.deepStrictEqual(
      openAiChunkToEvents({ choices: [{ index: 0, delta: { content: "" } }], svc_sources: sources }),
      [{ _tag: "Sources", sources }]
    )
    assert.deepStrictEqual(
      openAiChunkToEvents({ choices: [{ index: 0, delta: { reasoning_content: "r1" } }] }),
      [{ _tag: "ReasoningDelta", text: "r1" }]
    )
    assert.deepStrictEqual(
      openAiChunkToEvents({ choices: [{ index: 0, delta: { reasoning: "r2", content: "t" } }] }),
      [
        { _tag: "ReasoningDelta", text: "r2" },
        { _tag: "TextDelta", text: "t" }
      ]
    )
    assert.deepStrictEqual(
      openAiChunkToEvents({
        choices: [
          {
            index: 0,
            delta: {
              tool_calls: [
                { index: 0, id: "call_a", function: { name: "f", arguments: "" } },
                { index: 1, function: { arguments: '{"x"' } }
              ]
            }
          }
        ]
      }),
      [
        { _tag: "ToolCallDelta", index: 0, id: "call_a", name: "f", argumentsDelta: "" },
        { _tag: "ToolCallDelta", index: 1, id: undefined, name: undefined, argumentsDelta: '{"x"' }
      ]
    )
    assert.deepStrictEqual(
      openAiChunkToEvents({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] }),
      [{ _tag: "Finish", reason: "tool_calls" }]
    )
    assert.deepStrictEqual(
      openAiChunkToEvents({
        choices: [],
        usage: {
          prompt_tokens: 10,
          completion_tokens: 20,
          prompt_tokens_details: { cached_tokens: 4 },
          completion_tokens_details: { reasoning_tokens: 7 }
        }
      }),
      [{ _tag: "Usage", inputTokens: 10, outputTokens: 20, reasoningTokens: 7, cachedInputTokens: 4 }]
    )
  })
})

const encoder = new TextEncoder()
const run = <S>(codec: DialectCodec<S>, wire: string) =>
  Effect.runSyncExit(
    Stream.runCollect(decodeUpstreamStream(codec, Stream.fromIterable([encoder.encode(wire)])))
  )
const failureReason = (exit: Exit.Exit<unknown, { readonly reason: string }>) =>
  Exit.isFailure(exit) ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error.reason : undefined

const chunk = (delta: object, finish: string | null = null) =>
  `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`

describe("reading an upstream stream to its end", () => {
  it("openai: stops at [DONE] and reads nothing after it", () => {
    const exit = run(
      openAiCodec,
      `${chunk({ content: "a" })}${chunk({}, "stop")}data: [DONE]\n\ndata: {oops\n\n`
    )
    assert.deepStrictEqual(Exit.isSuccess(exit) ? exit.value : undefined, [
      { _tag: "TextDelta", text: "a" },
      { _tag: "Finish", reason: "stop" }
    ] satisfies Array<UpstreamEvent>)
  })

  it("openai: a finished reply whose body ends without [DONE] is whole; one without a finish is dropped", () => {
    assert.isTrue(Exit.isSuccess(run(openAiCodec, `${chunk({ content: "a" })}${chunk({}, "length")}`)))
    assert.strictEqual(failureReason(run(openAiCodec, chunk({ content: "a" }))), "dropped")
  })

  it("openai: a frame that is not a chunk is a protocol error; an error chunk is a provider error", () => {
    assert.strictEqual(failureReason(run(openAiCodec, "data: {not json\n\n")), "protocol")
    assert.strictEqual(failureReason(run(openAiCodec, 'data: {"choices":"x"}\n\n')), "protocol")
    assert.strictEqual(
      failureReason(run(openAiCodec, `${chunk({ content: "a" })}data: {"error":{"message":"boom"}}\n\n`)),
      "provider_error"
    )
  })

  it("anthropic: a stream without message_stop is dropped; an error event is a provider error", () => {
    const start = `event: message_start\ndata: ${JSON.stringify({ type: "message_start", message: {} })}\n\n`
    const stop = `event: message_stop\ndata: {"type":"message_stop"}\n\n`
    assert.isTrue(Exit.isSuccess(run(anthropicCodec, start + stop)))
    assert.strictEqual(failureReason(run(anthropicCodec, start)), "dropped")
    assert.strictEqual(
      failureReason(
        run(
          anthropicCodec,
          `${start}event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n`
        )
      ),
      "provider_error"
    )
    assert.strictEqual(failureReason(run(anthropicCodec, 'data: {"type":"message_start"}\n\n')), "protocol")
    // Event types added to the API later are skipped, not fatal.
    assert.isTrue(Exit.isSuccess(run(anthropicCodec, `${start}data: {"type":"future_event"}\n\n${stop}`)))
  })
})

describe("redacting provider error excerpts", () => {
  it("never lets a prompt window or a credential through", () => {
    fc.assert(
      fc.property(
        fc.string({ minLength: 8, maxLength: 60 }),
        fc.string({ maxLength: 40 }),
        fc.string({ maxLength: 40 }),
        (secret, before, after) => {
          const prompt = promptTexts({
            model: "m",
            messages: [{ role: "user", content: `note ${secret} end` }]
          })
          const excerpt = redactExcerpt(`${before}${secret}${after}`, prompt)
          assert.notInclude(excerpt, secret)
        }
      ),
      { numRuns: 300 }
    )
    const prompt = promptTexts({ model: "m", messages: [{ role: "user", content: "MARKER-7f3a9 please" }] })
    assert.strictEqual(
      redactExcerpt("invalid input 'MARKER-7f3a9' near token sk-abcdefgh1234", prompt, ["k3y"]),
      "invalid input '[redacted]' near token [redacted]"
    )
    assert.strictEqual(redactExcerpt("x".repeat(500), []).length, 201)
  })
})
