import { Result, Schema } from "effect"
import {
  type ChatCompletionRequest,
  type ChatMessage,
  FunctionTool,
  JsonResponseFormat,
  NamedToolChoice
} from "../../domain/Chat.ts"
import { MessagesStreamEvent, type MessagesUsage as MessagesWireUsage } from "../../domain/Messages.ts"
import type { FinishReason, UpstreamEvent } from "../Events.ts"
import type { SseEvent } from "./Sse.ts"
import { type StreamStep, sourcesToEvents } from "./StreamStep.ts"
import { protocolError, providerError, type UpstreamError } from "./UpstreamError.ts"

/**
 * The Anthropic Messages dialect: a chat-completions request translated into a Messages
 * request, and the Messages event stream translated into dialect-neutral events.
 */

export type MessagesContentBlock =
  | { readonly type: "text"; readonly text: string }
  | {
      readonly type: "image"
      readonly source:
        | { readonly type: "base64"; readonly media_type: string; readonly data: string }
        | { readonly type: "url"; readonly url: string }
    }
  | { readonly type: "tool_use"; readonly id: string; readonly name: string; readonly input: unknown }
  | {
      readonly type: "tool_result"
      readonly tool_use_id: string
      readonly content: string | ReadonlyArray<MessagesContentBlock>
    }

export interface MessagesTurn {
  readonly role: "user" | "assistant"
  readonly content: ReadonlyArray<MessagesContentBlock>
}

export interface MessagesTool {
  readonly name: string
  readonly description?: string
  readonly input_schema: Record<string, unknown>
  readonly strict?: boolean
}

/** What the router sends a Messages upstream: a narrower type of the wire request (`domain/Messages.ts`). */
export interface MessagesRequest {
  readonly model: string
  readonly max_tokens: number
  readonly messages: ReadonlyArray<MessagesTurn>
  readonly stream: true
  readonly system?: string
  readonly tools?: ReadonlyArray<MessagesTool>
  readonly tool_choice?:
    | { readonly type: "auto" | "any" | "none" }
    | { readonly type: "tool"; readonly name: string }
  readonly thinking?: { readonly type: "enabled"; readonly budget_tokens: number }
  readonly output_format?: { readonly type: "json_schema"; readonly schema: Record<string, unknown> }
  readonly stop_sequences?: ReadonlyArray<string>
  readonly temperature?: number
  readonly top_p?: number
}

/**
 * `reasoning_effort` to a thinking budget. The Messages API wants `1024 <= budget_tokens <
 * max_tokens`; the budget is capped at `max_tokens - 1`, and when that leaves less than the
 * 1024 minimum thinking is not asked for (the reply would have no room left anyway).
 * `none` asks for no thinking.
 */
export const THINKING_BUDGETS = { minimal: 1024, low: 2048, medium: 8192, high: 24_576 } as const
export const MIN_THINKING_BUDGET = 1024

export const thinkingBudgetFor = (
  effort: ChatCompletionRequest["reasoning_effort"],
  maxTokens: number
): number | undefined => {
  if (effort === undefined || effort === "none") return undefined
  const budget = Math.min(THINKING_BUDGETS[effort], maxTokens - 1)
  return budget >= MIN_THINKING_BUDGET ? budget : undefined
}

const partsText = (content: ChatMessage["content"]): string => {
  if (content === undefined || content === null) return ""
  if (typeof content === "string") return content
  return content.map((part) => (part.type === "text" ? part.text : "")).join("\n")
}

const dataUrl = /^data:([^;,]+)[^,]*;base64,(.*)$/s

export const imageUrlToBlock = (url: string): MessagesContentBlock => {
  const match = dataUrl.exec(url)
  return match === null
    ? { type: "image", source: { type: "url", url } }
    : { type: "image", source: { type: "base64", media_type: match[1]!, data: match[2]! } }
}

/** Text and image parts as blocks; empty text is dropped (the Messages API rejects it). */
const contentToBlocks = (content: ChatMessage["content"], images: boolean): Array<MessagesContentBlock> => {
  if (content === undefined || content === null) return []
  if (typeof content === "string") return content.length > 0 ? [{ type: "text", text: content }] : []
  const blocks: Array<MessagesContentBlock> = []
  for (const part of content) {
    if (part.type === "text") {
      if (part.text.length > 0) blocks.push({ type: "text", text: part.text })
    } else if (images) {
      blocks.push(imageUrlToBlock(part.image_url.url))
    }
  }
  return blocks
}

/** Tool arguments are a JSON object on the Messages side; anything else becomes `{}`. */
const parseToolInput = (args: string): unknown => {
  const parsed = Result.try(() => JSON.parse(args) as unknown)
  return Result.isSuccess(parsed) && typeof parsed.success === "object" && parsed.success !== null
    ? parsed.success
    : {}
}

const toolResultContent = (content: ChatMessage["content"]): MessagesTurn["content"] | string => {
  if (typeof content !== "object" || content === null) return content ?? ""
  return content.some((part) => part.type === "image_url")
    ? contentToBlocks(content, true)
    : partsText(content)
}

const messageToBlocks = (message: ChatMessage): Array<MessagesContentBlock> => {
  switch (message.role) {
    case "user":
      return contentToBlocks(message.content, true)
    case "assistant":
      return [
        ...contentToBlocks(message.content, false),
        ...(message.tool_calls ?? []).map(
          (call): MessagesContentBlock => ({
            type: "tool_use",
            id: call.id,
            name: call.function.name,
            input: parseToolInput(call.function.arguments)
          })
        )
      ]
    case "tool":
      return [
        {
          type: "tool_result",
          tool_use_id: message.tool_call_id ?? "",
          content: toolResultContent(message.content)
        }
      ]
    default:
      return []
  }
}

/**
 * Chat messages to Messages turns: system and developer messages are lifted out (joined by
 * a blank line), tool results ride in a user turn, and consecutive turns of one role merge,
 * so tool results and the user text after them form one turn.
 */
export const chatMessagesToTurns = (
  messages: ReadonlyArray<ChatMessage>
): { readonly system: string | undefined; readonly turns: ReadonlyArray<MessagesTurn> } => {
  const system: Array<string> = []
  const turns: Array<{ role: "user" | "assistant"; content: Array<MessagesContentBlock> }> = []
  for (const message of messages) {
    if (message.role === "system" || message.role === "developer") {
      const text = partsText(message.content)
      if (text.length > 0) system.push(text)
      continue
    }
    const blocks = messageToBlocks(message)
    if (blocks.length === 0) continue
    const role = message.role === "assistant" ? "assistant" : "user"
    const last = turns.at(-1)
    if (last?.role === role) last.content.push(...blocks)
    else turns.push({ role, content: blocks })
  }
  return { system: system.length > 0 ? system.join("\n\n") : undefined, turns }
}

const decodeFunctionTool = Schema.decodeUnknownOption(FunctionTool)

/** Function tools only: hosted tools were refused before payment, so none should arrive here. */
export const chatToolsToMessagesTools = (
  tools: ChatCompletionRequest["tools"]
): ReadonlyArray<MessagesTool> | undefined => {
  const out: Array<MessagesTool> = []
  for (const tool of tools ?? []) {
    const decoded = decodeFunctionTool(tool)
    if (decoded._tag === "None") continue
    const fn = decoded.value.function
    out.push({
      name: fn.name,
      ...(fn.description === undefined ? {} : { description: fn.description }),
      input_schema: fn.parameters ?? { type: "object", properties: {} },
      ...(typeof fn.strict === "boolean" ? { strict: fn.strict } : {})
    })
  }
  return out.length > 0 ? out : undefined
}

const decodeNamedToolChoice = Schema.decodeUnknownOption(NamedToolChoice)

export const chatToolChoiceToMessages = (choice: unknown): MessagesRequest["tool_choice"] => {
  switch (choice) {
    case undefined:
    case null:
      return undefined
    case "auto":
      return { type: "auto" }
    case "none":
      return { type: "none" }
    case "required":
      return { type: "any" }
  }
  const named = decodeNamedToolChoice(choice)
  return named._tag === "Some" ? { type: "tool", name: named.value.function.name } : undefined
}

const decodeJsonResponseFormat = Schema.decodeUnknownOption(JsonResponseFormat)

/** `json_object` has no Messages twin; it becomes the loosest schema, any JSON object. */
export const chatResponseFormatToOutputFormat = (format: unknown): MessagesRequest["output_format"] => {
  const json = decodeJsonResponseFormat(format)
  if (json._tag === "None") return undefined
  return {
    type: "json_schema",
    schema: (json.value.type === "json_schema" ? json.value.json_schema.schema : undefined) ?? {
      type: "object"
    }
  }
}

/**
 * The Messages request for a chat request. Thinking is dropped when a tool call is forced and
 * `temperature`/`top_p` are left out while thinking is on, as the Messages API refuses those
 * combinations; `temperature` is capped at 1, the top of Anthropic's range.
 */
export const chatRequestToMessagesRequest = (
  request: ChatCompletionRequest,
  modelClass: string,
  maxTokens: number
): MessagesRequest => {
  const { system, turns } = chatMessagesToTurns(request.messages)
  const tools = chatToolsToMessagesTools(request.tools)
  const toolChoice = chatToolChoiceToMessages(request.tool_choice)
  const forcedTool = toolChoice?.type === "any" || toolChoice?.type === "tool"
  const budget = forcedTool ? undefined : thinkingBudgetFor(request.reasoning_effort, maxTokens)
  const outputFormat = chatResponseFormatToOutputFormat(request.response_format)
  const stop = typeof request.stop === "string" ? [request.stop] : request.stop
  const temperature = budget === undefined ? request.temperature : undefined
  const topP = budget === undefined || (request.top_p ?? 0) >= 0.95 ? request.top_p : undefined
  return {
    model: modelClass,
    max_tokens: maxTokens,
    messages: turns,
    stream: true,
    ...(system === undefined ? {} : { system }),
    ...(tools === undefined ? {} : { tools }),
    ...(toolChoice === undefined ? {} : { tool_choice: toolChoice }),
    ...(budget === undefined ? {} : { thinking: { type: "enabled", budget_tokens: budget } }),
    ...(outputFormat === undefined ? {} : { output_format: outputFormat }),
    ...(stop === undefined || stop.length === 0 ? {} : { stop_sequences: stop }),
    ...(temperature === undefined ? {} : { temperature: Math.min(temperature, 1) }),
    ...(topP === undefined ? {} : { top_p: topP })
  }
}

// ---------------------------------------------------------------------------------------------
// The Messages event stream (`domain/Messages.ts`)

type MessagesUsage = typeof MessagesWireUsage.Type

type OpenBlock =
  | { readonly kind: "text" | "thinking" | "other" }
  | { readonly kind: "tool"; readonly toolIndex: number; readonly sawArguments: boolean }

export interface AnthropicStreamState {
  /** Open content blocks by their Messages index. */
  readonly blocks: ReadonlyMap<number, OpenBlock>
  /** Tool calls are numbered from 0 in order, as chat `tool_calls[].index` are. */
  readonly toolCount: number
  readonly inputTokens: number | undefined
  readonly cacheReadTokens: number | undefined
  readonly cacheCreationTokens: number | undefined
}

export const initialAnthropicState: AnthropicStreamState = {
  blocks: new Map(),
  toolCount: 0,
  inputTokens: undefined,
  cacheReadTokens: undefined,
  cacheCreationTokens: undefined
}

export const anthropicStopReason = (reason: string): FinishReason => {
  switch (reason) {
    case "max_tokens":
    case "model_context_window_exceeded":
      return "length"
    case "tool_use":
      return "tool_calls"
    case "refusal":
      return "content_filter"
    default:
      return "stop"
  }
}

const withBlock = (state: AnthropicStreamState, index: number, block: OpenBlock | undefined) => {
  const blocks = new Map(state.blocks)
  if (block === undefined) blocks.delete(index)
  else blocks.set(index, block)
  return blocks
}

type Step = Result.Result<StreamStep<AnthropicStreamState>, UpstreamError>
const step = (state: AnthropicStreamState, events: ReadonlyArray<UpstreamEvent> = [], done = false): Step =>
  Result.succeed({ state, events, done })

/**
 * Input tokens count the whole prompt, as `prompt_tokens` does in the chat dialect: the
 * Messages API reports cache reads and cache writes beside `input_tokens`, not inside it.
 */
const usageEvent = (state: AnthropicStreamState, usage: MessagesUsage | null | undefined): UpstreamEvent => {
  const input = usage?.input_tokens ?? state.inputTokens
  const cacheRead = usage?.cache_read_input_tokens ?? state.cacheReadTokens
  const cacheCreation = usage?.cache_creation_input_tokens ?? state.cacheCreationTokens
  return {
    _tag: "Usage",
    inputTokens: input === undefined ? undefined : input + (cacheRead ?? 0) + (cacheCreation ?? 0),
    outputTokens: usage?.output_tokens ?? undefined,
    reasoningTokens: undefined,
    cachedInputTokens: cacheRead
  }
}

/** The streaming state machine: one Messages event in, dialect-neutral events out. */
export const anthropicEventToEvents = (state: AnthropicStreamState, event: MessagesStreamEvent): Step => {
  switch (event.type) {
    case "message_start": {
      const usage = event.message.usage
      const next: AnthropicStreamState = {
        ...state,
        inputTokens: usage?.input_tokens ?? state.inputTokens,
        cacheReadTokens: usage?.cache_read_input_tokens ?? state.cacheReadTokens,
        cacheCreationTokens: usage?.cache_creation_input_tokens ?? state.cacheCreationTokens
      }
      return step(next, sourcesToEvents(event.message.svc_sources))
    }
    case "content_block_start": {
      const block = event.content_block
      switch (block.type) {
        case "text": {
          const next = { ...state, blocks: withBlock(state, event.index, { kind: "text" }) }
          return step(next, block.text ? [{ _tag: "TextDelta", text: block.text }] : [])
        }
        case "thinking": {
          const next = { ...state, blocks: withBlock(state, event.index, { kind: "thinking" }) }
          return step(next, block.thinking ? [{ _tag: "ReasoningDelta", text: block.thinking }] : [])
        }
        case "tool_use": {
          if (!block.id || !block.name) return Result.fail(protocolError("tool_use block without id or name"))
          const toolIndex = state.toolCount
          const next = {
            ...state,
            toolCount: toolIndex + 1,
            blocks: withBlock(state, event.index, { kind: "tool", toolIndex, sawArguments: false })
          }
          return step(next, [
            { _tag: "ToolCallDelta", index: toolIndex, id: block.id, name: block.name, argumentsDelta: "" }
          ])
        }
        default:
          // redacted_thinking and server-side blocks carry nothing the caller is shown.
          return step({ ...state, blocks: withBlock(state, event.index, { kind: "other" }) })
      }
    }
    case "content_block_delta": {
      const block = state.blocks.get(event.index)
      if (block === undefined) {
        return Result.fail(protocolError(`delta for content block ${event.index}, which is not open`))
      }
      const delta = event.delta
      switch (delta.type) {
        case "text_delta":
          return step(state, delta.text ? [{ _tag: "TextDelta", text: delta.text }] : [])
        case "thinking_delta":
          return step(state, delta.thinking ? [{ _tag: "ReasoningDelta", text: delta.thinking }] : [])
        case "input_json_delta": {
          if (block.kind !== "tool")
            return Result.fail(protocolError("input_json_delta outside a tool_use block"))
          const piece = delta.partial_json ?? ""
          const next =
            block.sawArguments || piece.length === 0
              ? state
              : { ...state, blocks: withBlock(state, event.index, { ...block, sawArguments: true }) }
          return step(next, [{ _tag: "ToolCallDelta", index: block.toolIndex, argumentsDelta: piece }])
        }
        default:
          return step(state)
      }
    }
    case "content_block_stop": {
      const block = state.blocks.get(event.index)
      const next = { ...state, blocks: withBlock(state, event.index, undefined) }
      // A tool called without arguments streams no input_json; chat callers expect "{}".
      return block?.kind === "tool" && !block.sawArguments
        ? step(next, [{ _tag: "ToolCallDelta", index: block.toolIndex, argumentsDelta: "{}" }])
        : step(next)
    }
    case "message_delta": {
      const stopReason = event.delta?.stop_reason
      const events: Array<UpstreamEvent> = []
      if (stopReason !== undefined && stopReason !== null) {
        events.push({ _tag: "Finish", reason: anthropicStopReason(stopReason) })
      }
      events.push(usageEvent(state, event.usage))
      return step(state, events)
    }
    case "message_stop":
      return step(state, [], true)
    case "ping":
      return step(state)
    case "error":
      return Result.fail(providerError(event.error?.type ?? undefined, event.error?.message ?? undefined))
  }
}

const knownTypes: ReadonlySet<string> = new Set(
  MessagesStreamEvent.members.map((member) => member.fields.type.literal)
)
const parseJson = Schema.decodeUnknownResult(Schema.fromJsonString(Schema.Unknown))
const decodeEvent = Schema.decodeUnknownResult(MessagesStreamEvent)

/** One SSE frame of a Messages stream; event types this code does not know are skipped. */
export const anthropicFrameToStep = (state: AnthropicStreamState, frame: SseEvent): Step => {
  const json = parseJson(frame.data)
  if (Result.isFailure(json))
    return Result.fail(protocolError("upstream sent a Messages event that is not JSON"))
  const value = json.success
  const type = typeof value === "object" && value !== null && "type" in value ? value.type : undefined
  if (typeof type !== "string")
    return Result.fail(protocolError("upstream sent a Messages event without a type"))
  if (!knownTypes.has(type)) return step(state)
  const event = decodeEvent(value)
  if (Result.isFailure(event)) return Result.fail(protocolError(`upstream sent a malformed ${type} event`))
  return anthropicEventToEvents(state, event.success)
}
