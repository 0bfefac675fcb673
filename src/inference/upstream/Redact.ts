import type { ChatCompletionRequest } from "../../domain/Chat.ts"

/**
 * Provider error bodies can echo the request (validation messages quote the offending input),
 * and an excerpt of one ends up in errors and logs. So the excerpt is cut short, credentials are
 * masked, and every run of the excerpt that also occurs in the prompt is masked: no window of
 * `PROMPT_WINDOW` characters of prompt text survives.
 */
export const EXCERPT_LIMIT = 200
const PROMPT_WINDOW = 8
const MASK = "[redacted]"
const credentialPattern = /\b(?:sk-|sk_|Bearer\s+)[A-Za-z0-9._~+/=-]{6,}/g

/** Every piece of caller text the request carries, raw and as JSON-escaped. */
export const promptTexts = (request: ChatCompletionRequest): ReadonlyArray<string> => {
  const texts: Array<string> = []
  for (const message of request.messages) {
    const content = message.content
    if (typeof content === "string") texts.push(content)
    else for (const part of content ?? []) texts.push(part.type === "text" ? part.text : part.image_url.url)
    for (const call of message.tool_calls ?? []) texts.push(call.function.arguments)
  }
  texts.push(JSON.stringify(request.messages))
  return texts
}

export const redactExcerpt = (
  excerpt: string,
  prompt: ReadonlyArray<string>,
  secrets: ReadonlyArray<string> = []
): string => {
  let text = excerpt.slice(0, EXCERPT_LIMIT + 100)
  for (const secret of secrets) if (secret.length > 0) text = text.split(secret).join(MASK)
  text = text.replace(credentialPattern, MASK)
  const masked = new Uint8Array(text.length)
  for (let i = 0; i + PROMPT_WINDOW <= text.length; i++) {
    const window = text.slice(i, i + PROMPT_WINDOW)
    if (prompt.some((p) => p.includes(window))) masked.fill(1, i, i + PROMPT_WINDOW)
  }
  // Short prompt texts (a one-word message) are below the window; mask them whole.
  for (const p of prompt) {
    if (p.length < 3 || p.length >= PROMPT_WINDOW) continue
    for (let at = text.indexOf(p); at !== -1; at = text.indexOf(p, at + 1)) masked.fill(1, at, at + p.length)
  }
  let out = ""
  for (let i = 0; i < text.length; i++) {
    if (masked[i] === 0) out += text[i]
    else if (i === 0 || masked[i - 1] === 0) out += MASK
  }
  return out.length > EXCERPT_LIMIT ? `${out.slice(0, EXCERPT_LIMIT)}…` : out
}
