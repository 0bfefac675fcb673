import { assert, describe, it } from "@effect/vitest"
import { Result, Schema } from "effect"
import fc from "fast-check"
import type { ChatCompletionRequest, ChatMessage } from "../../src/domain/Chat.ts"
import { CountTokensRequest, MessagesRequest } from "../../src/domain/Messages.ts"
import { ResponsesRequest } from "../../src/domain/Responses.ts"
import { countMessagesTokens } from "../../src/inference/adapters/CountTokens.ts"
import {
  effortForBudget,
  messagesShowsThinking,
  messagesToChatRequest
} from "../../src/inference/adapters/MessagesRequest.ts"
import {
  responsesShowsReasoning,
  responsesToChatRequest
} from "../../src/inference/adapters/ResponsesRequest.ts"

const decodeResponses = Schema.decodeUnknownSync(ResponsesRequest)
const decodeMessages = Schema.decodeUnknownSync(MessagesRequest)
const decodeCount = Schema.decodeUnknownSync(CountTokensRequest)

const ok = (result: Result.Result<ChatCompletionRequest, unknown>): ChatCompletionRequest => {
  if (Result.isFailure(result)) throw new Error(`translation failed: ${JSON.stringify(result.failure)}`)
  return result.success
}
const failure = (result: Result.Result<unknown, { _tag: string; code: string; param?: string }>) => {
  if (Result.isSuccess(result)) throw new Error("expected the translation to refuse")
  return result.failure
}

const textsOf = (message: ChatMessage): Array<string> => {
  const content = message.content
  if (content === undefined || content === null) return []
  if (typeof content === "string") return [content]
  return content.flatMap((p) => (p.type === "text" ? [p.text] : []))
}

// ---------------------------------------------------------------------------------------------
// Responses

const id = fc.stringMatching(/^[A-Za-z0-9_]{1,12}$/)
const args = fc
  .dictionary(fc.stringMatching(/^[a-z]{1,6}$/), fc.oneof(fc.string(), fc.integer()))
  .map((o) => JSON.stringify(o))
const texts = fc.array(fc.string(), { minLength: 1, maxLength: 3 })

const responsesItem = fc.oneof(
  fc.record({
    role: fc.constantFrom("user", "assistant", "system", "developer"),
    content: fc.oneof(
      fc.string(),
      texts.map((ts) => ts.map((text) => ({ type: "input_text", text })))
    )
  }),
  fc.record({
    type: fc.constant("message"),
    role: fc.constant("assistant"),
    content: texts.map((ts) => ts.map((text) => ({ type: "output_text", text, annotations: [] })))
  }),
  fc.record({ type: fc.constant("function_call"), call_id: id, name: id, arguments: args }),
  fc.record({ type: fc.constant("function_call_output"), call_id: id, output: fc.string() }),
  fc.constant({ type: "reasoning", id: "rs_1", summary: [] })
)

type GeneratedItem = {
  type?: string
  role?: string
  content?: string | Array<{ text: string }>
  call_id?: string
  name?: string
  arguments?: string
  output?: string
}

describe("responsesToChatRequest", () => {
  it("preserves every text, tool call and tool result, in order (property)", () => {
    fc.assert(
      fc.property(
        fc.array(responsesItem, { minLength: 1, maxLength: 8 }),
        fc.option(fc.string({ minLength: 1 })),
        (items, instructions) => {
          fc.pre(instructions !== null || items.some((i) => !("type" in i) || i.type !== "reasoning"))
          const request = decodeResponses({
            model: "auto",
            input: items,
            ...(instructions === null ? {} : { instructions })
          })
          const chat = ok(responsesToChatRequest(request))
          const generated = items as ReadonlyArray<GeneratedItem>
          const expectedTexts = [
            ...(instructions === null ? [] : [instructions]),
            ...generated.flatMap((item) =>
              item.role !== undefined
                ? typeof item.content === "string"
                  ? [item.content]
                  : (item.content ?? []).map((p) => p.text)
                : item.type === "function_call_output"
                  ? [item.output!]
                  : []
            )
          ]
          assert.deepStrictEqual(chat.messages.flatMap(textsOf), expectedTexts)
          assert.deepStrictEqual(
            chat.messages.flatMap((m) =>
              (m.tool_calls ?? []).map((c) => [c.id, c.function.name, c.function.arguments])
            ),
            generated.filter((i) => i.type === "function_call").map((i) => [i.call_id, i.name, i.arguments])
          )
          assert.deepStrictEqual(
            chat.messages.filter((m) => m.role === "tool").map((m) => m.tool_call_id),
            generated.filter((i) => i.type === "function_call_output").map((i) => i.call_id)
          )
          // A call always rides on an assistant message.
          for (const m of chat.messages)
            if (m.tool_calls !== undefined) assert.strictEqual(m.role, "assistant")
        }
      ),
      { numRuns: 300 }
    )
  })

  it("maps tools, tool_choice, text.format, reasoning and limits", () => {
    const chat = ok(
      responsesToChatRequest(
        decodeResponses({
          model: "best",
          input: "hi",
          tools: [
            { type: "function", name: "f", parameters: { type: "object" }, strict: true, description: "d" },
            { type: "web_search" }
          ],
          tool_choice: { type: "function", name: "f" },
          text: { format: { type: "json_schema", name: "out", schema: { type: "object" }, strict: true } },
          reasoning: { effort: "xhigh", summary: "auto" },
          max_output_tokens: 300,
          temperature: 0.5,
          stream: true
        })
      )
    )
    assert.deepStrictEqual(chat.tools, [
      {
        type: "function",
        function: { name: "f", description: "d", parameters: { type: "object" }, strict: true }
      },
      { type: "web_search" }
    ])
    assert.deepStrictEqual(chat.tool_choice, { type: "function", function: { name: "f" } })
    assert.deepStrictEqual(chat.response_format, {
      type: "json_schema",
      json_schema: { name: "out", schema: { type: "object" }, strict: true }
    })
    assert.strictEqual(chat.reasoning_effort, "high")
    assert.strictEqual(chat.max_tokens, 300)
    assert.strictEqual(chat.temperature, 0.5)
    assert.strictEqual(chat.stream, true)
    assert.isUndefined(chat.include_reasoning)
    assert.deepStrictEqual(chat.messages, [{ role: "user", content: "hi" }])

    const allowed = ok(
      responsesToChatRequest(
        decodeResponses({
          model: "auto",
          input: "hi",
          tools: [
            { type: "function", name: "a" },
            { type: "function", name: "b" }
          ],
          tool_choice: { type: "allowed_tools", mode: "required", tools: [{ type: "function", name: "b" }] }
        })
      )
    )
    assert.deepStrictEqual(
      allowed.tools?.map((t) => ("function" in t ? t.function.name : t.type)),
      ["b"]
    )
    assert.strictEqual(allowed.tool_choice, "required")
  })

  it("images become image_url parts; file ids, stored state and hosted items are refused by name", () => {
    const chat = ok(
      responsesToChatRequest(
        decodeResponses({
          model: "auto",
          input: [
            {
              role: "user",
              content: [
                { type: "input_text", text: "look" },
                { type: "input_image", image_url: "data:image/png;base64,AAAA", detail: "low" }
              ]
            }
          ]
        })
      )
    )
    assert.deepStrictEqual(chat.messages[0]!.content, [
      { type: "text", text: "look" },
      { type: "image_url", image_url: { url: "data:image/png;base64,AAAA", detail: "low" } }
    ])
    const fileImage = failure(
      responsesToChatRequest(
        decodeResponses({
          model: "auto",
          input: [{ role: "user", content: [{ type: "input_image", file_id: "f" }] }]
        })
      )
    )
    assert.strictEqual(fileImage._tag, "InvalidRequest")
    const previous = failure(
      responsesToChatRequest(decodeResponses({ model: "auto", input: "x", previous_response_id: "resp_1" }))
    )
    assert.strictEqual(previous.param, "previous_response_id")
    const reference = failure(
      responsesToChatRequest(
        decodeResponses({ model: "auto", input: [{ type: "item_reference", id: "msg_1" }] })
      )
    )
    assert.strictEqual(reference._tag, "InvalidRequest")
    const computer = failure(
      responsesToChatRequest(
        decodeResponses({ model: "auto", input: [{ type: "computer_call", call_id: "c" }] })
      )
    )
    assert.strictEqual(computer._tag, "CapabilityUnsupported")
    const hostedChoice = failure(
      responsesToChatRequest(
        decodeResponses({ model: "auto", input: "x", tool_choice: { type: "web_search_preview" } })
      )
    )
    assert.strictEqual(hostedChoice._tag, "CapabilityUnsupported")
    assert.strictEqual(
      failure(responsesToChatRequest(decodeResponses({ model: "auto", input: [] }))).param,
      "input"
    )
  })

  it("shows reasoning only when asked (a summary or include_reasoning)", () => {
    assert.isFalse(
      responsesShowsReasoning(decodeResponses({ model: "a", input: "x", reasoning: { effort: "low" } }))
    )
    assert.isTrue(
      responsesShowsReasoning(decodeResponses({ model: "a", input: "x", reasoning: { summary: "auto" } }))
    )
    assert.isTrue(
      responsesShowsReasoning(decodeResponses({ model: "a", input: "x", include_reasoning: true }))
    )
  })
})

// ---------------------------------------------------------------------------------------------
// Messages

const textBlock = fc.string().map((text) => ({ type: "text", text }))
const userBlocks = fc.array(
  fc.oneof(
    textBlock,
    fc.record({
      type: fc.constant("tool_result"),
      tool_use_id: id,
      content: fc.oneof(fc.string(), fc.array(textBlock, { minLength: 1, maxLength: 2 }))
    }),
    fc.constant({ type: "image", source: { type: "base64", media_type: "image/png", data: "QUJD" } })
  ),
  { minLength: 1, maxLength: 4 }
)
const assistantBlocks = fc.array(
  fc.oneof(
    textBlock,
    fc.record({
      type: fc.constant("tool_use"),
      id,
      name: id,
      input: fc.dictionary(
        fc.stringMatching(/^[a-z]{1,5}$/),
        fc.oneof(fc.string(), fc.integer(), fc.boolean())
      )
    }),
    fc.constant({ type: "thinking", thinking: "hidden", signature: "sig" })
  ),
  { minLength: 1, maxLength: 4 }
)
const turn = fc.oneof(
  fc.record({ role: fc.constant("user"), content: fc.oneof(fc.string({ minLength: 1 }), userBlocks) }),
  fc.record({ role: fc.constant("assistant"), content: assistantBlocks })
)

type Block = {
  type: string
  text?: string
  id?: string
  name?: string
  input?: unknown
  tool_use_id?: string
  content?: string | Array<{ text: string }>
}
const blocksOf = (t: { content: string | ReadonlyArray<unknown> }): ReadonlyArray<Block> =>
  typeof t.content === "string" ? [{ type: "text", text: t.content }] : (t.content as ReadonlyArray<Block>)

describe("messagesToChatRequest", () => {
  it("preserves texts, tool_use ids and inputs, tool results (property)", () => {
    fc.assert(
      fc.property(
        fc.array(turn, { minLength: 1, maxLength: 6 }),
        fc.option(fc.string({ minLength: 1 })),
        (turns, system) => {
          const generated = turns as ReadonlyArray<{ role: string; content: string | ReadonlyArray<unknown> }>
          const hasTurn = generated.some((t) => blocksOf(t).some((b) => b.type !== "thinking"))
          fc.pre(hasTurn)
          const request = decodeMessages({
            model: "auto",
            max_tokens: 100,
            messages: turns,
            ...(system === null ? {} : { system })
          })
          const chat = ok(messagesToChatRequest(request))
          const blocks = generated.flatMap(blocksOf)
          const plain = blocks.filter((b) => b.type === "text").map((b) => b.text!)
          assert.deepStrictEqual(chat.messages.filter((m) => m.role !== "tool").flatMap(textsOf), [
            ...(system === null ? [] : [system]),
            ...plain
          ])
          assert.deepStrictEqual(
            chat.messages.flatMap((m) =>
              (m.tool_calls ?? []).map((c) => [c.id, c.function.name, JSON.parse(c.function.arguments)])
            ),
            blocks.filter((b) => b.type === "tool_use").map((b) => [b.id, b.name, b.input])
          )
          const results = blocks.filter((b) => b.type === "tool_result")
          const tools = chat.messages.filter((m) => m.role === "tool")
          assert.deepStrictEqual(
            tools.map((m) => m.tool_call_id),
            results.map((b) => b.tool_use_id)
          )
          assert.deepStrictEqual(
            tools.map((m) => textsOf(m).join("")),
            results.map((b) =>
              typeof b.content === "string" ? b.content : (b.content ?? []).map((p) => p.text).join("")
            )
          )
          const images = chat.messages.flatMap((m) =>
            Array.isArray(m.content) ? m.content.filter((p) => p.type === "image_url") : []
          )
          assert.strictEqual(images.length, blocks.filter((b) => b.type === "image").length)
          for (const image of images)
            if (image.type === "image_url")
              assert.strictEqual(image.image_url.url, "data:image/png;base64,QUJD")
          assert.isFalse(
            JSON.stringify(chat.messages).includes("hidden"),
            "thinking from earlier turns is dropped"
          )
        }
      ),
      { numRuns: 300 }
    )
  })

  it("maps thinking, effort, structured output, tools, tool_choice and stop sequences", () => {
    const base = { model: "auto", max_tokens: 4000, messages: [{ role: "user", content: "hi" }] }
    const budget = ok(
      messagesToChatRequest(decodeMessages({ ...base, thinking: { type: "enabled", budget_tokens: 2000 } }))
    )
    assert.strictEqual(budget.reasoning_effort, "low")
    const adaptive = ok(
      messagesToChatRequest(
        decodeMessages({ ...base, thinking: { type: "adaptive" }, output_config: { effort: "max" } })
      )
    )
    assert.strictEqual(adaptive.reasoning_effort, "high")
    const effortOnly = ok(
      messagesToChatRequest(decodeMessages({ ...base, output_config: { effort: "low" } }))
    )
    assert.isUndefined(effortOnly.reasoning_effort)
    const disabled = ok(messagesToChatRequest(decodeMessages({ ...base, thinking: { type: "disabled" } })))
    assert.strictEqual(disabled.reasoning_effort, "none")
    assert.deepStrictEqual([1, 1024, 1025, 2048, 8192, 8193, 60_000].map(effortForBudget), [
      "minimal",
      "minimal",
      "low",
      "low",
      "medium",
      "high",
      "high"
    ])
    assert.isTrue(messagesShowsThinking(decodeMessages({ ...base, thinking: { type: "adaptive" } })))
    assert.isFalse(
      messagesShowsThinking(decodeMessages({ ...base, thinking: { type: "adaptive", display: "omitted" } }))
    )
    assert.isFalse(messagesShowsThinking(decodeMessages(base)))

    const full = ok(
      messagesToChatRequest(
        decodeMessages({
          ...base,
          system: [
            { type: "text", text: "one", cache_control: { type: "ephemeral" } },
            { type: "text", text: "two" }
          ],
          tools: [
            { name: "f", input_schema: { type: "object" }, strict: true },
            { type: "web_search_20250305", name: "web_search" }
          ],
          tool_choice: { type: "any" },
          output_format: { type: "json_schema", schema: { type: "object" } },
          stop_sequences: ["END"],
          temperature: 0.2
        })
      )
    )
    assert.deepStrictEqual(full.messages[0], {
      role: "system",
      content: [
        { type: "text", text: "one" },
        { type: "text", text: "two" }
      ]
    })
    assert.deepStrictEqual(full.tools, [
      { type: "function", function: { name: "f", parameters: { type: "object" }, strict: true } },
      { type: "web_search_20250305" }
    ])
    assert.strictEqual(full.tool_choice, "required")
    assert.deepStrictEqual(full.response_format, {
      type: "json_schema",
      json_schema: { name: "output", schema: { type: "object" }, strict: true }
    })
    assert.deepStrictEqual(full.stop, ["END"])
    assert.strictEqual(full.max_tokens, 4000)
    const named = ok(
      messagesToChatRequest(decodeMessages({ ...base, tool_choice: { type: "tool", name: "f" } }))
    )
    assert.deepStrictEqual(named.tool_choice, { type: "function", function: { name: "f" } })
  })

  it("tool results come first in their turn, flagged when they are errors", () => {
    const chat = ok(
      messagesToChatRequest(
        decodeMessages({
          model: "auto",
          max_tokens: 10,
          messages: [
            { role: "user", content: "q" },
            {
              role: "assistant",
              content: [
                { type: "text", text: "calling" },
                { type: "tool_use", id: "t1", name: "f", input: { a: 1 } },
                { type: "tool_use", id: "t2", name: "g", input: {} }
              ]
            },
            {
              role: "user",
              content: [
                { type: "text", text: "after" },
                { type: "tool_result", tool_use_id: "t1", content: "fine" },
                { type: "tool_result", tool_use_id: "t2", content: "boom", is_error: true }
              ]
            }
          ]
        })
      )
    )
    assert.deepStrictEqual(
      chat.messages.map((m) => m.role),
      ["user", "assistant", "tool", "tool", "user"]
    )
    assert.strictEqual(chat.messages[1]!.tool_calls!.length, 2)
    assert.deepStrictEqual(chat.messages[3]!.content, "[tool error] boom")
  })

  it("refuses server tool blocks and unsupported blocks by name", () => {
    const server = failure(
      messagesToChatRequest(
        decodeMessages({
          model: "auto",
          max_tokens: 10,
          messages: [
            {
              role: "assistant",
              content: [{ type: "server_tool_use", id: "s", name: "web_search", input: {} }]
            }
          ]
        })
      )
    )
    assert.strictEqual(server._tag, "CapabilityUnsupported")
    const document = failure(
      messagesToChatRequest(
        decodeMessages({
          model: "auto",
          max_tokens: 10,
          messages: [{ role: "user", content: [{ type: "document", source: { type: "base64" } }] }]
        })
      )
    )
    assert.strictEqual(document._tag, "InvalidRequest")
    const mcp = failure(
      messagesToChatRequest(
        decodeMessages({
          model: "auto",
          max_tokens: 10,
          mcp_servers: [{ type: "url", url: "https://mcp.example.com", name: "x" }],
          messages: [{ role: "user", content: "hi" }]
        })
      )
    )
    assert.strictEqual(mcp._tag, "CapabilityUnsupported")
    assert.strictEqual(mcp.param, "mcp_servers")
    assert.match(document.param ?? "", /^messages\[0\]/)
  })
})

describe("count_tokens", () => {
  it("grows with the prompt and the tools; the same tokenizer as the authorization bound", () => {
    const count = (body: unknown) => {
      const result = countMessagesTokens(decodeCount(body))
      if (Result.isFailure(result)) throw new Error("count failed")
      return result.success.input_tokens
    }
    const base = { model: "auto", messages: [{ role: "user", content: "hello" }] }
    const small = count(base)
    assert.isAbove(small, 0)
    assert.isAbove(count({ ...base, system: "a long system prompt with many words in it" }), small)
    assert.isAbove(
      count({
        ...base,
        tools: [{ name: "f", description: "does things", input_schema: { type: "object" } }]
      }),
      small
    )
    fc.assert(
      fc.property(fc.string(), fc.string(), (a, b) => {
        const one = count({ model: "auto", messages: [{ role: "user", content: a }] })
        const two = count({
          model: "auto",
          messages: [
            { role: "user", content: a },
            { role: "assistant", content: b }
          ]
        })
        assert.isAbove(two, one)
      }),
      { numRuns: 100 }
    )
  })
})
