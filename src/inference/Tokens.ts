import { createRequire } from "node:module"
import type { ChatMessage } from "../domain/Chat.ts"

type Count = typeof import("gpt-tokenizer/encoding/o200k_base")["countTokens"]

/**
 * The o200k_base tokenizer, loaded at its first count: its rank table is about 20 MB of heap and 60 MB
 * of RSS that a router holds for nothing until a request is priced (D341). The same module `gpt-tokenizer`
 * exports as `countTokens`, so counts are unchanged.
 */
let loaded: Count | undefined

/**
 * Text as text: a special token's spelling (`<|endoftext|>`) in a prompt or a reply is counted as the characters
 * it is, as a provider reads a caller's text. The tokenizer's default refuses such text with an exception, which
 * made any prompt that quoted one a 500 and any reply that did a failed meter (D554).
 */
const PLAIN = { disallowedSpecial: new Set<string>() }

const count = (text: string): number => {
  loaded ??= (createRequire(import.meta.url)("gpt-tokenizer/encoding/o200k_base") as { countTokens: Count })
    .countTokens
  return loaded(text, PLAIN)
}

/** Per-message framing overhead, as OpenAI counts chat messages. */
const MESSAGE_OVERHEAD = 4
const REPLY_PRIMER = 3

/**
 * BPE cost grows badly on one enormous "word" (a run with no whitespace), so long text is
 * counted in windows cut at whitespace where possible. A cut inside a word can only add a
 * token, which keeps the estimate on the safe (authorizing) side.
 */
const WINDOW = 2048
export const countTextTokens = (text: string): number => {
  let total = 0
  let start = 0
  while (start < text.length) {
    let end = Math.min(text.length, start + WINDOW)
    if (end < text.length) {
      const space = text.lastIndexOf(" ", end)
      if (space > start + WINDOW / 2) end = space
    }
    total += count(text.slice(start, end))
    start = end
  }
  return total
}

const contentText = (content: ChatMessage["content"]): string => {
  if (content === undefined || content === null) return ""
  if (typeof content === "string") return content
  return content.map((part) => (part.type === "text" ? part.text : "")).join("\n")
}

/** A fixed charge per image part (a low-detail tile), documented in docs/decisions.md. */
export const IMAGE_PART_TOKENS = 85

/** Local estimate of prompt tokens with a real BPE tokenizer (cl100k/o200k family). */
export const estimatePromptTokens = (messages: ReadonlyArray<ChatMessage>): number => {
  let total = REPLY_PRIMER
  for (const message of messages) {
    total += MESSAGE_OVERHEAD + countTextTokens(contentText(message.content))
    if (Array.isArray(message.content)) {
      total += message.content.filter((p) => p.type === "image_url").length * IMAGE_PART_TOKENS
    }
    for (const call of message.tool_calls ?? []) {
      total += countTextTokens(call.function.name) + countTextTokens(call.function.arguments)
    }
  }
  return total
}
