import { Result } from "effect"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import type { CountTokensRequest, MessageParam, ResultBlock } from "../../domain/Messages.ts"
import {
  appendToolCall,
  type ChatPart,
  type ChatTool,
  chatEffort,
  invalid,
  type MutableMessage,
  type Translated,
  type TranslationError,
  unsupported
} from "./Common.ts"

/** A Messages request (`domain/Messages.ts`) as the internal chat-completions request. */

/** Whether thinking blocks go back to the caller: only when the caller turned thinking on. */
export const messagesShowsThinking = (request: CountTokensRequest): boolean => {
  const thinking = request.thinking
  if (thinking === undefined) return false
  if (thinking.type === "enabled") return true
  return thinking.type === "adaptive" && !("display" in thinking && thinking.display === "omitted")
}

/** A thinking budget as the nearest chat effort at or above it (the chat request carries no budget). */
export const effortForBudget = (budget: number): NonNullable<ChatCompletionRequest["reasoning_effort"]> =>
  budget <= 1024 ? "minimal" : budget <= 2048 ? "low" : budget <= 8192 ? "medium" : "high"

/**
 * Reasoning for the chat request: a thinking budget maps to the nearest effort; adaptive
 * thinking takes `output_config.effort` (default medium); disabled thinking asks for none.
 * Effort without thinking is not mapped: a chat model has no thinking for it to scale.
 */
const reasoningEffort = (request: CountTokensRequest): ChatCompletionRequest["reasoning_effort"] => {
  const thinking = request.thinking
  if (thinking === undefined) return undefined
  if (thinking.type === "enabled" && "budget_tokens" in thinking)
    return effortForBudget(thinking.budget_tokens)
  if (thinking.type === "adaptive") return chatEffort(request.output_config?.effort ?? "medium")
  if (thinking.type === "disabled") return "none"
  return undefined
}

const isServerBlock = (type: string) =>
  type === "server_tool_use" || type.endsWith("_tool_result") || type.startsWith("mcp_")

type Block = ResultBlock

const part = (block: Block, param: string): Result.Result<ChatPart, TranslationError> => {
  if (block.type === "text" && "text" in block) return Result.succeed({ type: "text", text: block.text })
  if (block.type === "image" && "source" in block) {
    const source = block.source
    if (source.type === "base64" && "data" in source) {
      return Result.succeed({
        type: "image_url",
        image_url: { url: `data:${source.media_type};base64,${source.data}` }
      })
    }
    if (source.type === "url" && "url" in source) {
      return Result.succeed({ type: "image_url", image_url: { url: source.url } })
    }
    return invalid(param, `image source type "${source.type}" is not supported; send base64 or url`)
  }
  return invalid(param, `content block type "${block.type}" is not supported here`)
}

const parts = (
  value: string | ReadonlyArray<Block>,
  param: string
): Result.Result<string | Array<ChatPart>, TranslationError> => {
  if (typeof value === "string") return Result.succeed(value)
  const out: Array<ChatPart> = []
  for (const block of value) {
    const translated = part(block, param)
    if (Result.isFailure(translated)) return Result.fail(translated.failure)
    out.push(translated.success)
  }
  return Result.succeed(out)
}

const errorPrefix = "[tool error] "

/**
 * One Messages turn as chat messages. In a user turn, tool results come first (each its own
 * tool message, as chat requires them right after the calling assistant message), then the
 * rest of the turn as one user message. Thinking blocks from earlier turns are dropped: they
 * are the provider's own state.
 */
const turnMessages = (
  turn: MessageParam,
  index: number,
  messages: Array<MutableMessage>
): Result.Result<void, TranslationError> => {
  const param = `messages[${index}].content`
  if (typeof turn.content === "string") {
    messages.push({ role: turn.role, content: turn.content })
    return Result.succeed(undefined)
  }
  const rest: Array<ChatPart> = []
  const calls: Array<{ id: string; name: string; arguments: string }> = []
  for (const block of turn.content) {
    if (block.type === "thinking" || block.type === "redacted_thinking") continue
    if (block.type === "tool_use" && "input" in block) {
      if (turn.role !== "assistant") return invalid(param, "tool_use blocks belong to assistant turns")
      calls.push({ id: block.id, name: block.name, arguments: JSON.stringify(block.input ?? {}) })
    } else if (block.type === "tool_result" && "tool_use_id" in block) {
      if (turn.role !== "user") return invalid(param, "tool_result blocks belong to user turns")
      const translated = parts(block.content ?? "", param)
      if (Result.isFailure(translated)) return Result.fail(translated.failure)
      let result = translated.success
      if (block.is_error === true) {
        result =
          typeof result === "string" ? errorPrefix + result : [{ type: "text", text: errorPrefix }, ...result]
      }
      messages.push({ role: "tool", tool_call_id: block.tool_use_id, content: result })
    } else if (isServerBlock(block.type)) {
      return unsupported(
        param,
        `Server tool block "${block.type}" is not available through this router; use local function tools`
      )
    } else {
      const translated = part(block, param)
      if (Result.isFailure(translated)) return Result.fail(translated.failure)
      rest.push(translated.success)
    }
  }
  if (rest.length > 0) messages.push({ role: turn.role, content: rest })
  for (const call of calls) appendToolCall(messages, call)
  return Result.succeed(undefined)
}

const tools = (request: CountTokensRequest): Result.Result<Array<ChatTool>, TranslationError> => {
  const out: Array<ChatTool> = []
  for (const tool of request.tools ?? []) {
    if ("input_schema" in tool) {
      out.push({
        type: "function",
        function: {
          name: tool.name,
          ...(tool.description === undefined ? {} : { description: tool.description }),
          parameters: tool.input_schema,
          ...(tool.strict === undefined ? {} : { strict: tool.strict })
        }
      })
    } else if (tool.type === "custom") {
      return invalid("tools", "a custom tool needs a name and an input_schema")
    } else {
      // Kept by type only, so the capability gate refuses it by name before payment.
      out.push({ type: tool.type })
    }
  }
  return Result.succeed(out)
}

const toolChoice = (choice: CountTokensRequest["tool_choice"]): ChatCompletionRequest["tool_choice"] => {
  if (choice === undefined) return undefined
  switch (choice.type) {
    case "auto":
      return "auto"
    case "none":
      return "none"
    case "any":
      return "required"
    case "tool":
      return "name" in choice ? { type: "function", function: { name: choice.name } } : "required"
  }
}

/**
 * A Messages request as the internal (chat-completions) request. Structured output becomes a
 * strict `json_schema` response format (a Messages schema is already constrained output).
 */
export const messagesToChatRequest = (request: CountTokensRequest): Translated => {
  if ((request.mcp_servers?.length ?? 0) > 0) {
    return unsupported(
      "mcp_servers",
      "The hosted MCP connector is not available through this router; use local function tools"
    )
  }
  const messages: Array<MutableMessage> = []
  if (request.system !== undefined) {
    const system = parts(request.system, "system")
    if (Result.isFailure(system)) return Result.fail(system.failure)
    const value = system.success
    if (value.length > 0) messages.push({ role: "system", content: value })
  }
  for (let i = 0; i < request.messages.length; i++) {
    const translated = turnMessages(request.messages[i]!, i, messages)
    if (Result.isFailure(translated)) return Result.fail(translated.failure)
  }
  if (messages.every((m) => m.role === "system")) {
    return invalid("messages", "messages must carry at least one non-empty user or assistant turn")
  }
  const allTools = tools(request)
  if (Result.isFailure(allTools)) return Result.fail(allTools.failure)
  const choice = toolChoice(request.tool_choice)
  const format = request.output_config?.format ?? request.output_format ?? undefined
  const effort = reasoningEffort(request)
  return Result.succeed({
    model: request.model,
    messages,
    ...(request.max_tokens === undefined ? {} : { max_tokens: request.max_tokens }),
    stream: request.stream === true,
    ...(effort === undefined ? {} : { reasoning_effort: effort }),
    ...(request.routing === undefined ? {} : { routing: request.routing }),
    ...(request.context === undefined ? {} : { context: request.context }),
    ...(allTools.success.length === 0 ? {} : { tools: allTools.success }),
    ...(choice === undefined ? {} : { tool_choice: choice }),
    ...(format == null
      ? {}
      : {
          response_format: {
            type: "json_schema",
            json_schema: { name: "output", schema: format.schema, strict: true }
          }
        }),
    ...(request.stop_sequences === undefined || request.stop_sequences.length === 0
      ? {}
      : { stop: request.stop_sequences }),
    ...(request.temperature === undefined ? {} : { temperature: request.temperature }),
    ...(request.top_p === undefined ? {} : { top_p: request.top_p })
  })
}
