import { Result, Schema } from "effect"
import { ChatCompletionChunk, type ChatCompletionRequest, type ChatUsage } from "../../domain/Chat.ts"
import type { FinishReason, UpstreamEvent } from "../Events.ts"
import type { SseEvent } from "./Sse.ts"
import { type StreamStep, sourcesToEvents } from "./StreamStep.ts"
import { protocolError, providerError, type UpstreamError } from "./UpstreamError.ts"

/**
 * The OpenAI chat-completions dialect: the request body sent upstream and the translation of
 * `chat.completion.chunk`s into dialect-neutral events. Every OpenAI-compatible upstream
 * goes through this one module.
 */

/**
 * The body sent upstream: built from an allow-list, so router-only fields (`routing`,
 * `context`, `include_reasoning`) and the caller's `user` never leave the router. The
 * ceiling is sent as `max_completion_tokens`, the field reasoning models require (and the
 * one that counts reasoning inside the ceiling, as the worst-case authorization does).
 */
export const chatRequestToUpstream = (
  request: ChatCompletionRequest,
  modelClass: string,
  maxTokens: number
): ChatCompletionRequest => ({
  model: modelClass,
  messages: request.messages,
  max_completion_tokens: maxTokens,
  stream: true,
  stream_options: { include_usage: true },
  ...(request.tools === undefined ? {} : { tools: request.tools }),
  ...(request.tool_choice === undefined ? {} : { tool_choice: request.tool_choice }),
  ...(request.response_format === undefined ? {} : { response_format: request.response_format }),
  ...(request.reasoning_effort === undefined ? {} : { reasoning_effort: request.reasoning_effort }),
  ...(request.temperature === undefined ? {} : { temperature: request.temperature }),
  ...(request.top_p === undefined ? {} : { top_p: request.top_p }),
  ...(request.stop === undefined ? {} : { stop: request.stop }),
  ...(request.seed === undefined ? {} : { seed: request.seed })
})

type OpenAiUsage = ChatUsage
type OpenAiChunk = ChatCompletionChunk

const decodeChunkSchema = Schema.decodeUnknownResult(ChatCompletionChunk)

type Json = Record<string, unknown>
const isObject = (value: unknown): value is Json =>
  typeof value === "object" && value !== null && !Array.isArray(value)
const absentOr = (value: unknown, is: (present: unknown) => boolean) =>
  value === undefined || value === null || is(value)
const isString = (value: unknown) => typeof value === "string"
const isInt = (value: unknown) => Number.isSafeInteger(value)
const DELTA_TEXT_FIELDS = ["role", "content", "reasoning_content", "reasoning", "refusal"] as const
const isPlainDelta = (delta: unknown) =>
  isObject(delta) &&
  (delta.tool_calls === undefined || delta.tool_calls === null) &&
  DELTA_TEXT_FIELDS.every((field) => absentOr(delta[field], isString))
const isPlainChoice = (choice: unknown) =>
  isObject(choice) &&
  isInt(choice.index) &&
  absentOr(choice.delta, isPlainDelta) &&
  absentOr(choice.finish_reason, isString)
const isPlainUsage = (usage: unknown) =>
  isObject(usage) &&
  absentOr(usage.prompt_tokens, isInt) &&
  absentOr(usage.completion_tokens, isInt) &&
  absentOr(usage.total_tokens, isInt) &&
  absentOr(usage.prompt_tokens_details, (d) => isObject(d) && absentOr(d.cached_tokens, isInt)) &&
  absentOr(usage.completion_tokens_details, (d) => isObject(d) && absentOr(d.reasoning_tokens, isInt)) &&
  (usage.cost === undefined || typeof usage.cost === "number") &&
  usage.svc_estimates === undefined

/**
 * Whether a parsed chunk is one of the common shapes (text, role, reasoning, finish, usage) that
 * `ChatCompletionChunk` accepts exactly as it stands: every field it checks holds what the schema
 * declares (fields the schema does not declare are ignored by both). Anything else (tool calls,
 * sources, `svc`, errors, a field of the wrong type) goes through the schema. Checking these by hand
 * is a fraction of the schema's cost on the hottest loop of a paid call (every upstream frame);
 * test/inference/upstream/openAiChunk.test.ts holds the two to the same answers.
 */
export const isPlainChunk = (chunk: unknown): chunk is OpenAiChunk =>
  isObject(chunk) &&
  absentOr(chunk.id, isString) &&
  absentOr(chunk.object, isString) &&
  absentOr(chunk.created, isInt) &&
  absentOr(chunk.model, isString) &&
  absentOr(chunk.choices, (choices) => Array.isArray(choices) && choices.every(isPlainChoice)) &&
  absentOr(chunk.usage, isPlainUsage) &&
  chunk.svc_sources === undefined &&
  chunk.svc === undefined &&
  (chunk.error === undefined || chunk.error === null)

/** One frame's JSON as a chunk: the common shapes checked by hand, the rest by the schema. */
export const decodeChunk = (data: string): Result.Result<OpenAiChunk, unknown> => {
  let parsed: unknown
  try {
    parsed = JSON.parse(data)
  } catch (error) {
    return Result.fail(error)
  }
  return isPlainChunk(parsed) ? Result.succeed(parsed) : decodeChunkSchema(parsed)
}
export const openAiFinishReason = (reason: string): FinishReason => {
  switch (reason) {
    case "length":
      return "length"
    case "tool_calls":
    case "function_call":
      return "tool_calls"
    case "content_filter":
      return "content_filter"
    default:
      return "stop"
  }
}

export const openaiUsageToUsage = (usage: OpenAiUsage): UpstreamEvent => ({
  _tag: "Usage",
  inputTokens: usage.prompt_tokens ?? undefined,
  outputTokens: usage.completion_tokens ?? undefined,
  reasoningTokens: usage.completion_tokens_details?.reasoning_tokens ?? undefined,
  cachedInputTokens: usage.prompt_tokens_details?.cached_tokens ?? undefined
})

/** Events of one chunk, in wire order: sources, reasoning, text, tool calls, finish, usage. */
export const openAiChunkToEvents = (chunk: OpenAiChunk): ReadonlyArray<UpstreamEvent> => {
  const events = sourcesToEvents(chunk.svc_sources)
  // One choice is asked for; other indexes could only come from a misbehaving upstream.
  const choice = chunk.choices?.find((c) => c.index === 0)
  const delta = choice?.delta
  if (delta !== undefined && delta !== null) {
    const reasoning = delta.reasoning_content ?? delta.reasoning
    if (reasoning !== undefined && reasoning !== null && reasoning.length > 0) {
      events.push({ _tag: "ReasoningDelta", text: reasoning })
    }
    if (delta.content !== undefined && delta.content !== null && delta.content.length > 0) {
      events.push({ _tag: "TextDelta", text: delta.content })
    }
    for (const call of delta.tool_calls ?? []) {
      events.push({
        _tag: "ToolCallDelta",
        index: call.index ?? 0,
        id: call.id ?? undefined,
        name: call.function?.name ?? undefined,
        argumentsDelta: call.function?.arguments ?? ""
      })
    }
  }
  if (choice?.finish_reason !== undefined && choice.finish_reason !== null) {
    events.push({ _tag: "Finish", reason: openAiFinishReason(choice.finish_reason) })
  }
  if (chunk.usage !== undefined && chunk.usage !== null) events.push(openaiUsageToUsage(chunk.usage))
  return events
}

/** Where an OpenAI stream stands: a finish reason seen is enough to call the reply whole. */
export interface OpenAiStreamState {
  readonly finished: boolean
}
export const initialOpenAiState: OpenAiStreamState = { finished: false }

/** One SSE frame of an OpenAI stream: `[DONE]` ends it, an `error` chunk fails it. */
export const openAiFrameToStep = (
  state: OpenAiStreamState,
  frame: SseEvent
): Result.Result<StreamStep<OpenAiStreamState>, UpstreamError> => {
  const data = frame.data.trim()
  if (data === "[DONE]") return Result.succeed({ state, events: [], done: true })
  const decoded = decodeChunk(data)
  if (Result.isFailure(decoded)) {
    return Result.fail(protocolError("upstream sent a chunk that is not a chat.completion.chunk"))
  }
  const chunk = decoded.success
  if (chunk.error !== undefined && chunk.error !== null) {
    return Result.fail(providerError(chunk.error.type ?? undefined, chunk.error.message ?? undefined))
  }
  const events = openAiChunkToEvents(chunk)
  const finished = state.finished || events.some((e) => e._tag === "Finish")
  return Result.succeed({ state: finished === state.finished ? state : { finished }, events, done: false })
}

/** At the end of the body: an OpenAI reply is whole once its finish reason arrived. */
export const openAiStreamComplete = (state: OpenAiStreamState): boolean => state.finished
