import { createHash } from "node:crypto"
import { countTokens } from "gpt-tokenizer"

/**
 * The simulated model: a pure function from a dialect-neutral request to a reply made of
 * pieces, each piece one completion token (tool-call starts excepted). Same prompt, same reply.
 */

export interface SimMessage {
  readonly role: string
  readonly text: string
}

export interface SimTool {
  readonly name: string
  /** The tool's JSON schema for its arguments (untrusted, walked loosely). */
  readonly parameters: unknown
}

export type SimToolChoice =
  | { readonly _tag: "Auto" }
  | { readonly _tag: "None" }
  | { readonly _tag: "Required" }
  | { readonly _tag: "Named"; readonly name: string }

export type SimResponseFormat =
  | { readonly _tag: "Text" }
  | { readonly _tag: "JsonObject" }
  | { readonly _tag: "JsonSchema"; readonly schema: unknown }

export interface SimRequest {
  readonly modelClass: string
  /** Every message's text in order, system prompt included: what the prompt tokens are counted over. */
  readonly messages: ReadonlyArray<SimMessage>
  /** Text of the last user message that carries text: where fault markers are read. */
  readonly lastUserText: string
  readonly maxTokens: number
  /** Asked-for reasoning and its token budget; undefined when reasoning is not asked. */
  readonly reasoning: { readonly budgetTokens: number } | undefined
  readonly tools: ReadonlyArray<SimTool>
  readonly toolChoice: SimToolChoice
  /** The conversation ends with a tool result, so the model answers in text instead of calling again. */
  readonly toolResultPending: boolean
  readonly responseFormat: SimResponseFormat
}

export interface SimSource {
  /** `[n]` in the reply text cites the source whose id is `"n"`. */
  readonly id: string
  readonly title: string
  readonly url: string
  readonly snippet: string
}

export type SimPiece =
  | { readonly _tag: "Reasoning"; readonly text: string }
  | { readonly _tag: "Text"; readonly text: string }
  | { readonly _tag: "ToolCallStart"; readonly index: number; readonly id: string; readonly name: string }
  | { readonly _tag: "ToolCallArguments"; readonly index: number; readonly text: string }

export type SimFinishReason = "stop" | "length" | "tool_calls"

export interface SimReply {
  readonly pieces: ReadonlyArray<SimPiece>
  readonly finishReason: SimFinishReason
  readonly promptTokens: number
  readonly completionTokens: number
  readonly reasoningTokens: number
  readonly sources: ReadonlyArray<SimSource>
}

export interface SimToolCall {
  readonly id: string
  readonly name: string
  readonly arguments: string
}

/** The class whose replies carry web sources and `[n]` citation markers. */
export const groundedClass = "grounded-medium"

export const isTokenPiece = (piece: SimPiece): boolean => piece._tag !== "ToolCallStart"

// ---------------------------------------------------------------------------------------------
// Fault markers: `[[sim:<name>]]` or `[[sim:<name>@<provider_id>]]` in the last user message.

export interface SimMarkers {
  readonly slow: boolean
  readonly error: boolean
  readonly drop: boolean
  readonly multiTool: boolean
  /** `[[sim:long]]`: a reply of up to 4,000 tokens (cut at max_tokens), for cancellation tests. */
  readonly long: boolean
}

const markerPattern = /\[\[sim:([a-z-]+)(?:@([A-Za-z0-9._:-]+))?\]\]/g

const markerNames = (text: string, providerId: string): ReadonlySet<string> => {
  const found = new Set<string>()
  for (const match of text.matchAll(markerPattern)) {
    const scope = match[2]
    if (scope === undefined || scope === providerId) found.add(match[1]!)
  }
  return found
}

export const markersFor = (text: string, providerId: string): SimMarkers => {
  const found = markerNames(text, providerId)
  return {
    slow: found.has("slow"),
    error: found.has("error"),
    drop: found.has("drop"),
    multiTool: found.has("multi-tool"),
    long: found.has("long")
  }
}

/**
 * `[[sim:rich]]`: a grounded reply adds two sources with unsafe URLs, cites them and an
 * unknown id, and places `[[rich:sources]]` and `[[rich:missing]]` (svc.rich tests).
 */
export const wantsRich = (text: string, providerId: string): boolean =>
  markerNames(text, providerId).has("rich")

// ---------------------------------------------------------------------------------------------
// Deterministic words

const vocabulary = [
  "market",
  "quote",
  "price",
  "token",
  "signal",
  "river",
  "stone",
  "light",
  "model",
  "answer",
  "bridge",
  "garden",
  "window",
  "number",
  "system",
  "value",
  "order",
  "clear",
  "simple",
  "steady",
  "quiet",
  "bright",
  "north",
  "green",
  "paper",
  "engine",
  "harvest",
  "cloud",
  "field",
  "route",
  "ledger",
  "second",
  "reason",
  "careful",
  "useful",
  "small",
  "large",
  "early",
  "later",
  "round",
  "plain",
  "fair",
  "open",
  "close",
  "level",
  "depth",
  "spread",
  "vector",
  "harbor",
  "summit",
  "meadow",
  "copper",
  "silver",
  "amber",
  "forest",
  "canyon",
  "lantern",
  "compass",
  "anchor",
  "thread",
  "circle",
  "morning",
  "evening",
  "journey"
] as const

/** A small seeded generator (mulberry32): deterministic and dependency-free. */
const makeRng = (seed: number) => {
  let state = seed >>> 0
  return (): number => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

type Rng = ReturnType<typeof makeRng>

const pick = (rng: Rng): string => vocabulary[Math.floor(rng() * vocabulary.length)]!
const intBetween = (rng: Rng, min: number, max: number): number => min + Math.floor(rng() * (max - min + 1))
const capitalize = (word: string): string => word.charAt(0).toUpperCase() + word.slice(1)

const promptDigest = (messages: ReadonlyArray<SimMessage>): Buffer =>
  createHash("sha256")
    .update(JSON.stringify(messages.map((m) => [m.role, m.text])))
    .digest()

/** Sentences as token pieces: "Word", " word", ..., " word." with optional citation pieces. */
const sentencePieces = (rng: Rng, tokens: number, citations: ReadonlyArray<string>): Array<string> => {
  const pieces: Array<string> = []
  let sentenceLeft = intBetween(rng, 6, 12)
  let citationIndex = 0
  let startOfSentence = true
  while (pieces.length < tokens) {
    const word = pick(rng)
    const remaining = tokens - pieces.length
    const endSentence = sentenceLeft <= 1 || remaining === 1
    let piece = startOfSentence
      ? pieces.length === 0
        ? capitalize(word)
        : ` ${capitalize(word)}`
      : ` ${word}`
    if (endSentence && citations.length > 0 && remaining >= 2) {
      pieces.push(piece)
      piece = ` [${citations[citationIndex % citations.length]}].`
      citationIndex++
    } else if (endSentence) {
      piece += "."
    }
    pieces.push(piece)
    startOfSentence = endSentence
    sentenceLeft = endSentence ? intBetween(rng, 6, 12) : sentenceLeft - 1
  }
  return pieces
}

const splitEvery = (text: string, size: number): Array<string> => {
  const out: Array<string> = []
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size))
  return out
}

// ---------------------------------------------------------------------------------------------
// Values from JSON schemas (tool arguments, structured output)

const isRecord = (u: unknown): u is Readonly<Record<string, unknown>> =>
  typeof u === "object" && u !== null && !Array.isArray(u)

const schemaType = (schema: Readonly<Record<string, unknown>>): string | undefined => {
  const type = schema.type
  if (typeof type === "string") return type
  if (Array.isArray(type)) return type.find((t): t is string => typeof t === "string" && t !== "null")
  if (isRecord(schema.properties)) return "object"
  if (schema.items !== undefined) return "array"
  return undefined
}

/**
 * A value that satisfies the simple parts of a JSON schema: required properties are filled
 * (strings with words, numbers with 1, booleans true), `enum`/`const` are honoured, the first
 * branch of `anyOf`/`oneOf` is taken.
 */
const valueForSchema = (schema: unknown, rng: Rng, depth = 0): unknown => {
  if (!isRecord(schema) || depth > 8) return pick(rng)
  if ("const" in schema) return schema.const
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[0]
  const branches = Array.isArray(schema.anyOf)
    ? schema.anyOf
    : Array.isArray(schema.oneOf)
      ? schema.oneOf
      : undefined
  if (branches !== undefined && branches.length > 0) return valueForSchema(branches[0], rng, depth + 1)
  switch (schemaType(schema)) {
    case "object": {
      const properties = isRecord(schema.properties) ? schema.properties : {}
      const required = Array.isArray(schema.required)
        ? schema.required.filter((k): k is string => typeof k === "string")
        : []
      const value: Record<string, unknown> = {}
      for (const key of required) value[key] = valueForSchema(properties[key], rng, depth + 1)
      return value
    }
    case "array": {
      const minItems = typeof schema.minItems === "number" ? Math.max(1, Math.min(schema.minItems, 5)) : 1
      return Array.from({ length: minItems }, () => valueForSchema(schema.items, rng, depth + 1))
    }
    case "integer":
    case "number":
      return typeof schema.minimum === "number" && schema.minimum > 1 ? Math.ceil(schema.minimum) : 1
    case "boolean":
      return true
    case "null":
      return null
    default:
      return `${pick(rng)} ${pick(rng)}`
  }
}

// ---------------------------------------------------------------------------------------------
// Sources for the grounded class

const sourcesFor = (rng: Rng): ReadonlyArray<SimSource> =>
  [1, 2, 3].map((n) => {
    const a = pick(rng)
    const b = pick(rng)
    return {
      id: String(n),
      title: `${capitalize(a)} ${b} report ${n}`,
      url: `https://example.org/${a}-${b}-${n}`,
      snippet: sentencePieces(rng, 12, []).join("")
    }
  })

/** Sources no caller may be shown: a cloud metadata address and a URL carrying credentials. */
const unsafeSources: ReadonlyArray<SimSource> = [
  {
    id: "4",
    title: "Instance metadata",
    url: "http://169.254.169.254/latest/meta-data",
    snippet: "internal"
  },
  { id: "5", title: "Private report", url: "https://reader:secret@example.org/private", snippet: "private" }
]

/** The tail of a `[[sim:rich]]` reply: an unknown citation and one known, one unknown block marker. */
const richTail = [" Unverified", " [9].", " [[rich:sources]]", " [[rich:missing]]"]

// ---------------------------------------------------------------------------------------------

export const promptTokens = (messages: ReadonlyArray<SimMessage>): number =>
  messages.reduce((sum, m) => sum + countTokens(m.text, { disallowedSpecial: new Set() }), 0)

const toolsToCall = (request: SimRequest, multiTool: boolean): ReadonlyArray<SimTool> => {
  if (request.tools.length === 0 || request.toolResultPending) return []
  switch (request.toolChoice._tag) {
    case "None":
      return []
    case "Named": {
      const name = request.toolChoice.name
      return request.tools.filter((t) => t.name === name).slice(0, 1)
    }
    default:
      return multiTool ? request.tools.slice(0, 3) : request.tools.slice(0, 1)
  }
}

/**
 * Reply for a request. `multiTool` comes from the request's markers (already scoped to the
 * serving provider by the caller). The natural reply is cut at `maxTokens` completion tokens,
 * reasoning first, as providers count reasoning inside the completion budget.
 */
export const simulate = (
  request: SimRequest,
  options: { readonly multiTool: boolean; readonly long?: boolean; readonly rich?: boolean }
): SimReply => {
  const digest = promptDigest(request.messages)
  const rng = makeRng(digest.readUInt32BE(0))
  const idBase = digest.subarray(4, 16).toString("hex")
  const grounded = request.modelClass === groundedClass
  const rich = grounded && options.rich === true
  const sources = grounded ? [...sourcesFor(rng), ...(rich ? unsafeSources : [])] : []

  const reasoning: Array<SimPiece> =
    request.reasoning === undefined
      ? []
      : sentencePieces(
          rng,
          Math.max(1, Math.min(request.reasoning.budgetTokens, intBetween(rng, 12, 48))),
          []
        ).map((text) => ({ _tag: "Reasoning", text }))

  const calls = toolsToCall(request, options.multiTool)
  const answer: Array<SimPiece> = []
  if (calls.length > 0) {
    calls.forEach((tool, index) => {
      answer.push({ _tag: "ToolCallStart", index, id: `${idBase}${index}`, name: tool.name })
      for (const text of splitEvery(JSON.stringify(valueForSchema(tool.parameters, rng)), 4)) {
        answer.push({ _tag: "ToolCallArguments", index, text })
      }
    })
  } else if (request.responseFormat._tag !== "Text") {
    const value =
      request.responseFormat._tag === "JsonSchema"
        ? valueForSchema(request.responseFormat.schema, rng)
        : { answer: sentencePieces(rng, 8, []).join("") }
    for (const text of splitEvery(JSON.stringify(value), 4)) answer.push({ _tag: "Text", text })
  } else {
    const citations = sources.map((s) => s.id)
    const length = options.long === true ? 4_000 : intBetween(rng, 12, 63)
    for (const text of sentencePieces(rng, length, citations)) answer.push({ _tag: "Text", text })
    if (rich) for (const text of richTail) answer.push({ _tag: "Text", text })
  }

  const limit = Math.max(0, request.maxTokens)
  const pieces: Array<SimPiece> = []
  let tokens = 0
  let truncated = false
  for (const piece of [...reasoning, ...answer]) {
    if (tokens >= limit) {
      truncated = true
      break
    }
    if (isTokenPiece(piece)) tokens++
    pieces.push(piece)
  }
  const reasoningTokens = pieces.filter((p) => p._tag === "Reasoning").length
  return {
    pieces,
    finishReason: truncated ? "length" : calls.length > 0 ? "tool_calls" : "stop",
    promptTokens: promptTokens(request.messages),
    completionTokens: tokens,
    reasoningTokens,
    sources
  }
}

export const reasoningText = (pieces: ReadonlyArray<SimPiece>): string =>
  pieces.map((p) => (p._tag === "Reasoning" ? p.text : "")).join("")

export const replyText = (pieces: ReadonlyArray<SimPiece>): string =>
  pieces.map((p) => (p._tag === "Text" ? p.text : "")).join("")

export const toolCalls = (pieces: ReadonlyArray<SimPiece>): ReadonlyArray<SimToolCall> => {
  const calls: Array<{ id: string; name: string; arguments: string }> = []
  for (const p of pieces) {
    if (p._tag === "ToolCallStart") calls[p.index] = { id: p.id, name: p.name, arguments: "" }
    else if (p._tag === "ToolCallArguments") calls[p.index]!.arguments += p.text
  }
  return calls
}
