import { assert, describe, it } from "@effect/vitest"
import { Result, Schema } from "effect"
import fc from "fast-check"
import { ChatCompletionChunk } from "../../../src/domain/Chat.ts"
import { decodeChunk, isPlainChunk, openAiChunkToEvents } from "../../../src/inference/upstream/OpenAiChat.ts"

const bySchema = Schema.decodeUnknownResult(Schema.fromJsonString(ChatCompletionChunk))

/** Both decoders give the same answer: both refuse, or both accept with the same events. */
const sameAnswer = (text: string) => {
  const fast = decodeChunk(text)
  const schema = bySchema(text)
  assert.strictEqual(Result.isSuccess(fast), Result.isSuccess(schema), text)
  if (Result.isSuccess(fast) && Result.isSuccess(schema)) {
    assert.deepStrictEqual(openAiChunkToEvents(fast.success), openAiChunkToEvents(schema.success), text)
  }
}

const maybe = <T>(arb: fc.Arbitrary<T>) => fc.option(fc.oneof(arb, fc.constant(null)), { nil: undefined })
const odd = fc.oneof(fc.string(), fc.integer(), fc.double(), fc.boolean(), fc.constant(null), fc.constant([]))
const intish = fc.oneof(fc.integer({ min: -5, max: 1_000_000 }), fc.constant(1.5), fc.constant(2 ** 60), odd)
const stringish = fc.oneof(fc.string({ maxLength: 8 }), odd)
const delta = fc.record(
  {
    role: maybe(stringish),
    content: maybe(stringish),
    reasoning_content: maybe(stringish),
    reasoning: maybe(stringish),
    refusal: maybe(stringish),
    tool_calls: maybe(fc.constant([{ index: 0, function: { name: "f", arguments: "{}" } }])),
    extra: maybe(odd)
  },
  { requiredKeys: [] }
)
const choice = fc.record(
  {
    index: intish,
    delta: maybe(fc.oneof(delta, odd)),
    logprobs: maybe(odd),
    finish_reason: maybe(stringish)
  },
  { requiredKeys: [] }
)
const usage = fc.record(
  {
    prompt_tokens: maybe(intish),
    completion_tokens: maybe(intish),
    total_tokens: maybe(intish),
    prompt_tokens_details: maybe(fc.oneof(fc.record({ cached_tokens: maybe(intish) }), odd)),
    completion_tokens_details: maybe(fc.oneof(fc.record({ reasoning_tokens: maybe(intish) }), odd)),
    cost: maybe(fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), odd)),
    svc_estimates: maybe(fc.oneof(fc.constant({ in: true }), odd))
  },
  { requiredKeys: [] }
)
const chunk = fc.record(
  {
    id: maybe(stringish),
    object: maybe(stringish),
    created: maybe(intish),
    model: maybe(stringish),
    choices: maybe(fc.oneof(fc.array(fc.oneof(choice, odd), { maxLength: 2 }), odd)),
    usage: maybe(fc.oneof(usage, odd)),
    svc_sources: maybe(fc.oneof(fc.constant([{ url: "u" }]), odd)),
    svc: fc.option(fc.oneof(fc.constant({ a: 1 }), odd), { nil: undefined }),
    error: maybe(fc.oneof(fc.record({ message: maybe(stringish), type: maybe(stringish) }), odd)),
    system_fingerprint: maybe(odd)
  },
  { requiredKeys: [] }
)

describe("OpenAI chunk decoding", () => {
  it("takes the common chunks (text, role, finish, usage) without the schema", () => {
    const common = [
      {
        id: "c1",
        object: "chat.completion.chunk",
        created: 1,
        model: "m",
        choices: [{ index: 0, delta: { role: "assistant", content: "Hello" }, finish_reason: null }]
      },
      {
        id: "c1",
        object: "chat.completion.chunk",
        created: 1,
        model: "m",
        choices: [{ index: 0, delta: {}, finish_reason: "stop" }]
      },
      {
        id: "c1",
        object: "chat.completion.chunk",
        created: 1,
        model: "m",
        choices: [],
        usage: { prompt_tokens: 12, completion_tokens: 6, total_tokens: 18 }
      },
      {
        id: "c1",
        choices: [{ index: 0, delta: { reasoning_content: "hm" }, logprobs: null }],
        system_fingerprint: "fp"
      }
    ]
    for (const value of common) {
      assert.isTrue(isPlainChunk(value), JSON.stringify(value))
      sameAnswer(JSON.stringify(value))
    }
    // Tool calls, sources, `svc` and errors are the schema's.
    assert.isFalse(isPlainChunk({ choices: [{ index: 0, delta: { tool_calls: [] } }] }))
    assert.isFalse(isPlainChunk({ svc_sources: [] }))
    assert.isFalse(isPlainChunk({ error: { message: "x" } }))
  })

  it("answers as the schema does, chunk by chunk", () => {
    fc.assert(
      fc.property(chunk, (value) => sameAnswer(JSON.stringify(value))),
      { numRuns: 3000 }
    )
    for (const text of ["", "[", "null", "[]", "42", '"x"', "{}", '{"choices":{}}', "{bad json"])
      sameAnswer(text)
  })
})
