import { Result } from "effect"
import type { ChatCompletionRequest, ChatMessage } from "../../domain/Chat.ts"
import { CapabilityUnsupported, InvalidRequest } from "../../domain/Errors.ts"

/** What a harness adapter's request translation can refuse, before any payment or provider work. */
export type TranslationError = InvalidRequest | CapabilityUnsupported
export type Translated = Result.Result<ChatCompletionRequest, TranslationError>

export const invalid = (param: string, message: string, code = "invalid_request") =>
  Result.fail(new InvalidRequest({ code, param, message }))

export const unsupported = (param: string, message: string) =>
  Result.fail(new CapabilityUnsupported({ code: "unsupported_capability", param, message }))

export type ChatPart = Exclude<NonNullable<ChatMessage["content"]>, string>[number]
export type ChatTool = NonNullable<ChatCompletionRequest["tools"]>[number]
export type MutableMessage = { -readonly [K in keyof ChatMessage]: ChatMessage[K] }

/**
 * Appends a tool call to the conversation: onto the assistant message just before it (a
 * reply's text and its calls, or several calls of one turn, are one chat message), else as a
 * new assistant message without text.
 */
export const appendToolCall = (
  messages: Array<MutableMessage>,
  call: { readonly id: string; readonly name: string; readonly arguments: string }
) => {
  const toolCall = {
    id: call.id,
    type: "function" as const,
    function: { name: call.name, arguments: call.arguments }
  }
  const last = messages.at(-1)
  if (last?.role === "assistant") last.tool_calls = [...(last.tool_calls ?? []), toolCall]
  else messages.push({ role: "assistant", content: null, tool_calls: [toolCall] })
}

/** Reasoning efforts beyond the chat set (`xhigh`, `max`) ask for the most the chat set has. */
export const chatEffort = (effort: string): NonNullable<ChatCompletionRequest["reasoning_effort"]> => {
  switch (effort) {
    case "none":
    case "minimal":
    case "low":
    case "medium":
    case "high":
      return effort
    default:
      return "high"
  }
}
