import { createHash } from "node:crypto"
import { Effect, Schema } from "effect"
import {
  type Message,
  type MessageParam,
  type MessagesErrorBody,
  MessagesRequest,
  type ResultBlock
} from "../../domain/Messages.ts"
import type { DecodedRequest, Dialect, DialectErrorKind, ReplyMeta, SseFrame } from "./Dialect.ts"
import {
  reasoningText,
  replyText,
  type SimFinishReason,
  type SimMessage,
  type SimPiece,
  type SimReply,
  type SimResponseFormat,
  type SimToolChoice,
  toolCalls
} from "./Simulator.ts"

type Content = MessageParam["content"]
type Block = Exclude<Content, string>[number] | ResultBlock

const effortBudget: Readonly<Record<string, number>> = { low: 16, medium: 32, high: 64, max: 96 }

const textOf = (block: Block): string => ("text" in block && typeof block.text === "string" ? block.text : "")

const blockText = (block: Block): string => {
  if ("input" in block) return JSON.stringify(block.input ?? {})
  if ("tool_use_id" in block) {
    const result = block.content ?? ""
    return typeof result === "string" ? result : result.map(textOf).join("")
  }
  return block.type === "text" ? textOf(block) : ""
}

const contentText = (content: Content | ReadonlyArray<ResultBlock>): string =>
  typeof content === "string" ? content : content.map(blockText).join("")

const userText = (content: Content): string =>
  typeof content === "string" ? content : content.map((b) => (b.type === "text" ? textOf(b) : "")).join("")

const toolChoiceOf = (choice: MessagesRequest["tool_choice"]): SimToolChoice => {
  if (choice === undefined) return { _tag: "Auto" }
  if ("name" in choice) return { _tag: "Named", name: choice.name }
  return choice.type === "none"
    ? { _tag: "None" }
    : choice.type === "any"
      ? { _tag: "Required" }
      : { _tag: "Auto" }
}

const responseFormatOf = (body: MessagesRequest): SimResponseFormat => {
  const format = body.output_config?.format ?? body.output_format
  return format == null ? { _tag: "Text" } : { _tag: "JsonSchema", schema: format.schema }
}

const reasoningOf = (body: MessagesRequest): { budgetTokens: number } | undefined => {
  const thinking = body.thinking
  if (thinking === undefined || (thinking.type !== "enabled" && thinking.type !== "adaptive"))
    return undefined
  const effort = body.output_config?.effort
  const budget = "budget_tokens" in thinking ? thinking.budget_tokens : undefined
  return {
    budgetTokens: budget ?? (effort == null ? 32 : (effortBudget[effort] ?? 32))
  }
}

export const messagesRequestToSim = (body: MessagesRequest): DecodedRequest => {
  const system = body.system === undefined ? [] : [{ role: "system", text: contentText(body.system) }]
  const messages: ReadonlyArray<SimMessage> = [
    ...system,
    ...body.messages.map((m) => ({ role: m.role, text: contentText(m.content) }))
  ]
  const lastUser = [...body.messages]
    .reverse()
    .map((m) => (m.role === "user" ? userText(m.content) : ""))
    .find((text) => text.length > 0)
  const last = body.messages.at(-1)
  return {
    model: body.model,
    stream: body.stream === true,
    request: {
      messages,
      lastUserText: lastUser ?? "",
      maxTokens: body.max_tokens,
      reasoning: reasoningOf(body),
      tools: (body.tools ?? []).flatMap((t) =>
        "input_schema" in t ? [{ name: t.name, parameters: t.input_schema }] : []
      ),
      toolChoice: toolChoiceOf(body.tool_choice),
      toolResultPending:
        last !== undefined &&
        typeof last.content !== "string" &&
        last.content.some((b) => "tool_use_id" in b),
      responseFormat: responseFormatOf(body)
    }
  }
}

const stopReasons: Record<SimFinishReason, string> = {
  stop: "end_turn",
  length: "max_tokens",
  tool_calls: "tool_use"
}

const thinkingSignature = (thinking: string): string => createHash("sha256").update(thinking).digest("base64")

const parseInput = (json: string): unknown => {
  try {
    return JSON.parse(json)
  } catch {
    return {}
  }
}

const sourcesField = (reply: SimReply) => (reply.sources.length > 0 ? { svc_sources: reply.sources } : {})

export const simReplyToMessage = (reply: SimReply, meta: ReplyMeta): Message => {
  const thinking = reasoningText(reply.pieces)
  const text = replyText(reply.pieces)
  const content: Message["content"] = [
    ...(thinking.length > 0
      ? [{ type: "thinking" as const, thinking, signature: thinkingSignature(thinking) }]
      : []),
    ...(text.length > 0 ? [{ type: "text" as const, text }] : []),
    ...toolCalls(reply.pieces).map((c) => ({
      type: "tool_use" as const,
      id: `toolu_${c.id}`,
      name: c.name,
      input: parseInput(c.arguments)
    }))
  ]
  return {
    id: meta.id,
    type: "message",
    role: "assistant",
    model: meta.model,
    content,
    stop_reason: stopReasons[reply.finishReason],
    stop_sequence: null,
    usage: simUsageToAnthropicUsage(reply),
    ...sourcesField(reply)
  }
}

export const simUsageToAnthropicUsage = (reply: SimReply) => ({
  input_tokens: reply.promptTokens,
  output_tokens: reply.completionTokens,
  cache_creation_input_tokens: 0,
  cache_read_input_tokens: 0
})

const blockKey = (piece: SimPiece): string =>
  piece._tag === "ToolCallStart" || piece._tag === "ToolCallArguments" ? `tool:${piece.index}` : piece._tag

/** Messages-API stream events; content blocks open and close as the piece kind changes. */
export const simReplyToMessageEvents = (reply: SimReply, meta: ReplyMeta): ReadonlyArray<SseFrame> => {
  const frames: Array<SseFrame> = []
  const event = (type: string, data: object, tokens = 0) =>
    frames.push({ text: `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`, tokens })
  event("message_start", {
    message: {
      id: meta.id,
      type: "message",
      role: "assistant",
      model: meta.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { ...simUsageToAnthropicUsage(reply), output_tokens: 0 },
      ...sourcesField(reply)
    }
  })
  let index = -1
  let open: string | undefined
  const thinking = reasoningText(reply.pieces)
  const close = () => {
    if (open === undefined) return
    if (open === "Reasoning") {
      event("content_block_delta", {
        index,
        delta: { type: "signature_delta", signature: thinkingSignature(thinking) }
      })
    }
    event("content_block_stop", { index })
    open = undefined
  }
  for (const piece of reply.pieces) {
    const key = blockKey(piece)
    if (key !== open) {
      close()
      index++
      open = key
      const block =
        piece._tag === "Reasoning"
          ? { type: "thinking", thinking: "" }
          : piece._tag === "Text"
            ? { type: "text", text: "" }
            : piece._tag === "ToolCallStart"
              ? { type: "tool_use", id: `toolu_${piece.id}`, name: piece.name, input: {} }
              : undefined
      if (block !== undefined) event("content_block_start", { index, content_block: block })
    }
    switch (piece._tag) {
      case "Reasoning":
        event("content_block_delta", { index, delta: { type: "thinking_delta", thinking: piece.text } }, 1)
        break
      case "Text":
        event("content_block_delta", { index, delta: { type: "text_delta", text: piece.text } }, 1)
        break
      case "ToolCallArguments":
        event(
          "content_block_delta",
          { index, delta: { type: "input_json_delta", partial_json: piece.text } },
          1
        )
        break
      case "ToolCallStart":
        break
    }
  }
  close()
  event("message_delta", {
    delta: { stop_reason: stopReasons[reply.finishReason], stop_sequence: null },
    usage: { output_tokens: reply.completionTokens }
  })
  event("message_stop", {})
  return frames
}

const errorTypes: Record<DialectErrorKind, readonly [number, string]> = {
  invalid_request: [400, "invalid_request_error"],
  not_found: [404, "not_found_error"],
  server_error: [500, "api_error"]
}

export const AnthropicDialect: Dialect = {
  name: "anthropic",
  path: "/v1/messages",
  decode: (body) => Schema.decodeUnknownEffect(MessagesRequest)(body).pipe(Effect.map(messagesRequestToSim)),
  completion: simReplyToMessage,
  streamFrames: simReplyToMessageEvents,
  errorStatus: (kind) => errorTypes[kind][0],
  errorBody: (kind, message): typeof MessagesErrorBody.Type => ({
    type: "error",
    error: { type: errorTypes[kind][1], message }
  })
}
