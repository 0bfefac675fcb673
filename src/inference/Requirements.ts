import type { ChatCompletionRequest } from "../domain/Chat.ts"
import { maxTokensOf } from "../domain/Chat.ts"
import type { Capability } from "../market/Catalog.ts"
import type { MarketRequest } from "../market/Rfq.ts"
import { estimatePromptTokens } from "./Tokens.ts"

/** The capabilities a chat request needs from a model class. */
export const requiredCapabilities = (request: ChatCompletionRequest): ReadonlyArray<Capability> => {
  const needs: Array<Capability> = []
  if ((request.tools?.length ?? 0) > 0) needs.push("tools")
  const format = request.response_format
  if (typeof format === "object" && format !== null && "type" in format && format.type !== "text")
    needs.push("json")
  if (
    request.messages.some((m) => Array.isArray(m.content) && m.content.some((p) => p.type === "image_url"))
  ) {
    needs.push("vision")
  }
  if (
    request.include_reasoning === true ||
    (request.reasoning_effort !== undefined && request.reasoning_effort !== "none")
  ) {
    needs.push("reasoning")
  }
  return needs
}

/** What the auction needs to know about a chat request (no prompt text leaves this function). */
export const marketRequestOf = (
  request: ChatCompletionRequest,
  promptTokens = estimatePromptTokens(request.messages)
): MarketRequest => {
  const slo = request.routing?.latency_slo
  return {
    requested: request.model,
    promptTokens,
    maxTokens: maxTokensOf(request),
    minQuality: request.routing?.min_quality,
    task: request.routing?.task,
    requiredCapabilities: requiredCapabilities(request),
    latencySlo: slo === undefined ? undefined : { deadlineMs: slo.deadline_ms, confidence: slo.confidence }
  }
}
