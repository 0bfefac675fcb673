import { Effect, Option, Schema } from "effect"
import {
  type ChatCompletion,
  type ChatCompletionChunk,
  ChatCompletionRequest,
  type ChatMessage,
  FunctionTool,
  JsonResponseFormat,
  NamedToolChoice,
  type OpenAiErrorBody
} from "../../domain/Chat.ts"
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

type ChunkDelta = NonNullable<NonNullable<ChatCompletionChunk["choices"]>[number]["delta"]>

const decodeNamedToolChoice = Schema.decodeUnknownOption(NamedToolChoice)
const decodeJsonResponseFormat = Schema.decodeUnknownOption(JsonResponseFormat)
const decodeFunctionTool = Schema.decodeUnknownOption(FunctionTool)

const defaultMaxTokens = 4096
const effortBudget: Readonly<Record<string, number>> = {
  minimal: 8,
  low: 16,
  medium: 32,
  high: 64,
  xhigh: 96
}

const messageText = (message: ChatMessage): string => {
  const content = message.content
  const text =
    typeof content === "string"
      ? content
      : (content ?? []).map((part) => (part.type === "text" ? part.text : "")).join("")
  const calls = (message.tool_calls ?? []).map((c) => `${c.function.name}(${c.function.arguments})`).join("")
  return text + calls
}

const toolChoiceOf = (choice: unknown): SimToolChoice => {
  if (choice === undefined || choice === null || choice === "auto") return { _tag: "Auto" }
  if (typeof choice === "string") return choice === "none" ? { _tag: "None" } : { _tag: "Required" }
  const named = decodeNamedToolChoice(choice)
  return Option.isSome(named) ? { _tag: "Named", name: named.value.function.name } : { _tag: "Auto" }
}

const responseFormatOf = (format: unknown): SimResponseFormat => {
  const json = decodeJsonResponseFormat(format)
  if (Option.isNone(json)) return { _tag: "Text" }
  return json.value.type === "json_schema"
    ? { _tag: "JsonSchema", schema: json.value.json_schema.schema }
    : { _tag: "JsonObject" }
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
      tools: (body.tools ?? []).flatMap((tool) =>
        Option.match(decodeFunctionTool(tool), {
          onNone: () => [],
          onSome: (t) => [{ name: t.function.name, parameters: t.function.parameters }]
        })
      ),
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

export const simReplyToChatCompletion = (reply: SimReply, meta: ReplyMeta): ChatCompletion => {
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
                  type: "function" as const,
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

const pieceDelta = (piece: SimPiece): ChunkDelta => {
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
  const chunk = (delta: ChunkDelta, finish: string | null, extra: Partial<ChatCompletionChunk> = {}) =>
    JSON.stringify({
      id: meta.id,
      object: "chat.completion.chunk",
      created: meta.created,
      model: meta.model,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
      usage: null,
      ...extra
    } satisfies ChatCompletionChunk)
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
      } satisfies ChatCompletionChunk)
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
  errorBody: (kind, message): typeof OpenAiErrorBody.Type => ({
    error: { message, type: errorTypes[kind][1], param: null, code: errorTypes[kind][2] }
  })
}
