import { Result } from "effect"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import type { ResponsesContentPart as ContentPart, ResponsesRequest } from "../../domain/Responses.ts"
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

/** A Responses request (`domain/Responses.ts`) as the internal chat-completions request. */

/** Whether the caller sees the provider's reasoning: asked with a summary or `include_reasoning`. */
export const responsesShowsReasoning = (request: ResponsesRequest): boolean =>
  request.include_reasoning === true || (request.reasoning?.summary ?? null) !== null

/** Item types of vendor-hosted tools (and their results): the router runs none of them. */
const isHostedItem = (type: string) =>
  type.endsWith("_call") || type.endsWith("_call_output") || type.startsWith("mcp_")

const contentPart = (part: ContentPart, param: string): Result.Result<ChatPart, TranslationError> => {
  switch (part.type) {
    case "input_text":
    case "output_text":
      if ("text" in part) return Result.succeed({ type: "text", text: part.text })
      break
    case "refusal":
      if ("refusal" in part) return Result.succeed({ type: "text", text: part.refusal })
      break
    case "input_image":
      if ("image_url" in part && typeof part.image_url === "string") {
        const detail = "detail" in part && typeof part.detail === "string" ? { detail: part.detail } : {}
        return Result.succeed({ type: "image_url", image_url: { url: part.image_url, ...detail } })
      }
      return invalid(
        param,
        "input_image needs image_url (https or a data URL); this router offers no Files API for file_id"
      )
    default:
      return invalid(param, `content part type "${part.type}" is not supported by this router`)
  }
  return invalid(param, `malformed ${part.type} content part`)
}

const content = (
  value: string | ReadonlyArray<ContentPart>,
  param: string
): Result.Result<string | Array<ChatPart>, TranslationError> => {
  if (typeof value === "string") return Result.succeed(value)
  const parts: Array<ChatPart> = []
  for (const part of value) {
    const translated = contentPart(part, param)
    if (Result.isFailure(translated)) return Result.fail(translated.failure)
    parts.push(translated.success)
  }
  return Result.succeed(parts)
}

const inputMessages = (request: ResponsesRequest): Result.Result<Array<MutableMessage>, TranslationError> => {
  const messages: Array<MutableMessage> = []
  const instructions = request.instructions ?? ""
  if (instructions.length > 0) messages.push({ role: "system", content: instructions })
  if (typeof request.input === "string") {
    messages.push({ role: "user", content: request.input })
    return Result.succeed(messages)
  }
  for (const item of request.input) {
    if ("role" in item) {
      const translated = content(item.content, "input")
      if (Result.isFailure(translated)) return Result.fail(translated.failure)
      messages.push({ role: item.role, content: translated.success })
    } else if (item.type === "function_call" && "call_id" in item && "arguments" in item) {
      appendToolCall(messages, { id: item.call_id, name: item.name, arguments: item.arguments })
    } else if (item.type === "function_call_output" && "output" in item) {
      const translated = content(item.output, "input")
      if (Result.isFailure(translated)) return Result.fail(translated.failure)
      messages.push({ role: "tool", tool_call_id: item.call_id, content: translated.success })
    } else if (item.type === "reasoning") {
      // Reasoning from an earlier turn is the provider's own state; another provider cannot use it.
    } else if (item.type === "item_reference") {
      return invalid(
        "input",
        "item_reference needs stored responses; this router stores no prompts or replies, send the items inline"
      )
    } else if (
      item.type === "message" ||
      item.type === "function_call" ||
      item.type === "function_call_output"
    ) {
      return invalid("input", `malformed ${item.type} input item`)
    } else if (isHostedItem(item.type)) {
      return unsupported(
        "input",
        `Hosted tool item "${item.type}" is not available through this router; use local function tools`
      )
    } else {
      return invalid("input", `input item type "${item.type}" is not supported by this router`)
    }
  }
  return Result.succeed(messages)
}

const tools = (request: ResponsesRequest): Result.Result<Array<ChatTool>, TranslationError> => {
  const out: Array<ChatTool> = []
  for (const tool of request.tools ?? []) {
    if ("name" in tool && tool.type === "function") {
      out.push({
        type: "function",
        function: {
          name: tool.name,
          ...(tool.description == null ? {} : { description: tool.description }),
          ...(tool.parameters == null ? {} : { parameters: tool.parameters }),
          ...(tool.strict == null ? {} : { strict: tool.strict })
        }
      })
    } else if (tool.type === "function") {
      return invalid("tools", "a function tool needs a name")
    } else {
      // Kept by type only, so the capability gate refuses it by name before payment.
      out.push({ type: tool.type })
    }
  }
  return Result.succeed(out)
}

type ChatToolChoice = ChatCompletionRequest["tool_choice"]

const toolChoice = (
  request: ResponsesRequest,
  all: Array<ChatTool>
): Result.Result<{ choice: ChatToolChoice; tools: Array<ChatTool> }, TranslationError> => {
  const choice = request.tool_choice
  if (choice == null) return Result.succeed({ choice: undefined, tools: all })
  if (typeof choice === "string") return Result.succeed({ choice, tools: all })
  if (choice.type === "function" && "name" in choice) {
    return Result.succeed({ choice: { type: "function", function: { name: choice.name } }, tools: all })
  }
  if (choice.type === "allowed_tools" && "mode" in choice) {
    const allowed = new Set(choice.tools.map((t) => t.name ?? t.type))
    const kept = all.filter((t) => allowed.has("function" in t ? t.function.name : t.type))
    return Result.succeed({ choice: choice.mode, tools: kept })
  }
  return unsupported(
    "tool_choice",
    `Hosted tool "${choice.type}" is not available through this router; use local function tools`
  )
}

const responseFormat = (request: ResponsesRequest): ChatCompletionRequest["response_format"] => {
  const format = request.text?.format
  if (format == null || format.type === "text") return undefined
  if (format.type === "json_object" || !("schema" in format)) return { type: "json_object" }
  return {
    type: "json_schema",
    json_schema: {
      name: format.name,
      schema: format.schema,
      ...(format.description == null ? {} : { description: format.description }),
      ...(format.strict == null ? {} : { strict: format.strict })
    }
  }
}

/**
 * A Responses request as the internal (chat-completions) request: instructions become the
 * system message, function calls ride on the assistant message before them, their outputs
 * become tool messages. Hosted tools keep their type so the capability gate refuses them.
 */
export const responsesToChatRequest = (request: ResponsesRequest): Translated => {
  if (request.previous_response_id != null) {
    return invalid(
      "previous_response_id",
      "this router stores no responses (privacy); send the whole conversation in input",
      "unsupported_parameter"
    )
  }
  if (request.conversation != null) {
    return invalid(
      "conversation",
      "this router keeps no conversations; send the items inline",
      "unsupported_parameter"
    )
  }
  if (request.background === true) {
    return invalid(
      "background",
      "background responses are not supported; stream instead",
      "unsupported_parameter"
    )
  }
  const messages = inputMessages(request)
  if (Result.isFailure(messages)) return Result.fail(messages.failure)
  if (messages.success.length === 0) return invalid("input", "input must contain at least one item")
  const allTools = tools(request)
  if (Result.isFailure(allTools)) return Result.fail(allTools.failure)
  const chosen = toolChoice(request, allTools.success)
  if (Result.isFailure(chosen)) return Result.fail(chosen.failure)
  const format = responseFormat(request)
  const effort = request.reasoning?.effort
  return Result.succeed({
    model: request.model,
    messages: messages.success,
    ...(request.max_output_tokens == null ? {} : { max_tokens: request.max_output_tokens }),
    stream: request.stream === true,
    ...(request.include_reasoning === undefined ? {} : { include_reasoning: request.include_reasoning }),
    ...(effort == null ? {} : { reasoning_effort: chatEffort(effort) }),
    ...(request.routing === undefined ? {} : { routing: request.routing }),
    ...(request.context === undefined ? {} : { context: request.context }),
    ...(chosen.success.tools.length === 0 ? {} : { tools: chosen.success.tools }),
    ...(chosen.success.choice === undefined ? {} : { tool_choice: chosen.success.choice }),
    ...(format === undefined ? {} : { response_format: format }),
    ...(request.temperature == null ? {} : { temperature: request.temperature }),
    ...(request.top_p == null ? {} : { top_p: request.top_p })
  })
}
