import { Effect, Schema } from "effect"
import type { DecodedRequest, Dialect, DialectErrorKind, ReplyMeta, SseFrame } from "./Dialect.ts"
import {
  reasoningText,
  replyText,
  type SimMessage,
  type SimPiece,
  type SimReply,
  type SimResponseFormat,
  type SimToolChoice,
  toolCalls
} from "./Simulator.ts"

const optional = <S extends Schema.Top>(schema: S) => Schema.optionalKey(Schema.NullOr(schema))

const ContentPart = Schema.Struct({ type: Schema.String, text: Schema.optionalKey(Schema.String) })

const ChatMessage = Schema.Struct({
  role: Schema.String,
  content: optional(Schema.Union([Schema.String, Schema.Array(ContentPart)])),
  tool_calls: optional(
    Schema.Array(
      Schema.Struct({ function: Schema.Struct({ name: Schema.String, arguments: Schema.String }) })
    )
  )
})

/** The part of an OpenAI chat-completions request the simulator reads; other fields are ignored. */
export const ChatCompletionRequest = Schema.Struct({
  model: Schema.String,
  messages: Schema.Array(ChatMessage),
  max_tokens: optional(Schema.Int),
  max_completion_tokens: optional(Schema.Int),
  stream: optional(Schema.Boolean),
  reasoning_effort: optional(Schema.String),
  include_reasoning: optional(Schema.Boolean),
  tools: optional(
    Schema.Array(
      Schema.Struct({
        type: Schema.String,
        function: Schema.Struct({ name: Schema.String, parameters: Schema.optionalKey(Schema.Unknown) })
      })
    )
  ),
  tool_choice: optional(
    Schema.Union([Schema.String, Schema.Struct({ function: Schema.Struct({ name: Schema.String }) })])
  ),
  response_format: optional(
    Schema.Struct({
      type: Schema.String,
      json_schema: Schema.optionalKey(Schema.Struct({ schema: Schema.optionalKey(Schema.Unknown) }))
    })
  )
})
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

const defaultMaxTokens = 4096
const effortBudget: Readonly<Record<string, number>> = {
  minimal: 8,
  low: 16,
  medium: 32,
  high: 64,
  xhigh: 96
}

const messageText = (message: (typeof ChatMessage)["Type"]): string => {
  const content = message.content
  const text =
    typeof content === "string"
      ? content
      : (content ?? []).map((part) => (part.type === "text" ? (part.text ?? "") : "")).join("")
  const calls = (message.tool_calls ?? []).map((c) => `${c.function.name}(${c.function.arguments})`).join("")
  return text + calls
}

const toolChoiceOf = (choice: ChatCompletionRequest["tool_choice"]): SimToolChoice => {
  if (choice === undefined || choice === null || choice === "auto") return { _tag: "Auto" }
  if (typeof choice === "string") return choice === "none" ? { _tag: "None" } : { _tag: "Required" }
  return { _tag: "Named", name: choice.function.name }
}

const responseFormatOf = (format: ChatCompletionRequest["response_format"]): SimResponseFormat => {
  if (format?.type === "json_schema") return { _tag: "JsonSchema", schema: format.json_schema?.schema }
  if (format?.type === "json_object") return { _tag: "JsonObject" }
  return { _tag: "Text" }
}

export const chatRequestToSim = (body: ChatCompletionRequest): DecodedRequest => {
  const messages: ReadonlyArray<SimMessage> = body.messages.map((m) => ({
    role: m.role,
    text: messageText(m)
  }))
  const lastUser = [...messages].reverse().find((m) => m.role === "user" && m.text.length > 0)
  const effort = body.reasoning_effort ?? undefined
  const reasoning =
    effort !== undefined && effort !== "none"
      ? { budgetTokens: effortBudget[effort] ?? 32 }
      : body.include_reasoning === true
        ? { budgetTokens: 32 }
        : undefined
  return {
    model: body.model,
    stream: body.stream === true,
    request: {
      messages,
      lastUserText: lastUser?.text ?? "",
      maxTokens: body.max_completion_tokens ?? body.max_tokens ?? defaultMaxTokens,
      reasoning,
      tools: (body.tools ?? []).map((t) => ({ name: t.function.name, parameters: t.function.parameters })),
      toolChoice: toolChoiceOf(body.tool_choice),
      toolResultPending: body.messages.at(-1)?.role === "tool",
      responseFormat: responseFormatOf(body.response_format)
    }
  }
}

export const simUsageToOpenAiUsage = (reply: SimReply) => ({
  prompt_tokens: reply.promptTokens,
  completion_tokens: reply.completionTokens,
  total_tokens: reply.promptTokens + reply.completionTokens,
  prompt_tokens_details: { cached_tokens: 0 },
  completion_tokens_details: { reasoning_tokens: reply.reasoningTokens }
})

const sourcesField = (reply: SimReply) => (reply.sources.length > 0 ? { svc_sources: reply.sources } : {})

export const simReplyToChatCompletion = (reply: SimReply, meta: ReplyMeta) => {
  const calls = toolCalls(reply.pieces)
  const text = replyText(reply.pieces)
  const reasoning = reasoningText(reply.pieces)
  return {
    id: meta.id,
    object: "chat.completion",
    created: meta.created,
    model: meta.model,
    choices: [
      {
        index: 0,
        message: {
          role: "assistant",
          content: calls.length > 0 && text.length === 0 ? null : text,
          refusal: null,
          ...(reasoning.length > 0 ? { reasoning_content: reasoning } : {}),
          ...(calls.length > 0
            ? {
                tool_calls: calls.map((c) => ({
                  id: `call_${c.id}`,
                  type: "function",
                  function: { name: c.name, arguments: c.arguments }
                }))
              }
            : {})
        },
        logprobs: null,
        finish_reason: reply.finishReason
      }
    ],
    usage: simUsageToOpenAiUsage(reply),
    ...sourcesField(reply)
  }
}

const pieceDelta = (piece: SimPiece) => {
  switch (piece._tag) {
    case "Reasoning":
      return { reasoning_content: piece.text }
    case "Text":
      return { content: piece.text }
    case "ToolCallStart":
      return {
        tool_calls: [
          {
            index: piece.index,
            id: `call_${piece.id}`,
            type: "function",
            function: { name: piece.name, arguments: "" }
          }
        ]
      }
    case "ToolCallArguments":
      return { tool_calls: [{ index: piece.index, function: { arguments: piece.text } }] }
  }
}

/** `chat.completion.chunk` frames; the usage chunk is always sent (the router asks for it). */
export const simReplyToChatChunks = (reply: SimReply, meta: ReplyMeta): ReadonlyArray<SseFrame> => {
  const chunk = (delta: object, finish: string | null, extra: object = {}) =>
    JSON.stringify({
      id: meta.id,
      object: "chat.completion.chunk",
      created: meta.created,
      model: meta.model,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
      usage: null,
      ...extra
    })
  const frame = (json: string, tokens = 0): SseFrame => ({ text: `data: ${json}\n\n`, tokens })
  return [
    frame(chunk({ role: "assistant", content: "" }, null, sourcesField(reply))),
    ...reply.pieces.map((piece) =>
      frame(chunk(pieceDelta(piece), null), piece._tag === "ToolCallStart" ? 0 : 1)
    ),
    frame(chunk({}, reply.finishReason)),
    frame(
      JSON.stringify({
        id: meta.id,
        object: "chat.completion.chunk",
        created: meta.created,
        model: meta.model,
        choices: [],
        usage: simUsageToOpenAiUsage(reply)
      })
    ),
    frame("[DONE]")
  ]
}

const errorTypes: Record<DialectErrorKind, readonly [number, string, string]> = {
  invalid_request: [400, "invalid_request_error", "invalid_request"],
  not_found: [404, "invalid_request_error", "model_not_found"],
  server_error: [500, "server_error", "internal_error"]
}

export const OpenAiDialect: Dialect = {
  name: "openai",
  path: "/v1/chat/completions",
  decode: (body) =>
    Schema.decodeUnknownEffect(ChatCompletionRequest)(body).pipe(Effect.map(chatRequestToSim)),
  completion: simReplyToChatCompletion,
  streamFrames: simReplyToChatChunks,
  errorStatus: (kind) => errorTypes[kind][0],
  errorBody: (kind, message) => ({
    error: { message, type: errorTypes[kind][1], param: null, code: errorTypes[kind][2] }
  })
}
