import type { FinishReason, UpstreamSource } from "../Events.ts"
import { type ServeEvent, type ServeSummary, wasCut } from "../Paid.ts"

/**
 * Served events as the Anthropic Messages API: one state machine yields the streamed event
 * sequence, and its final message is also the non-streaming body, so both shapes agree.
 */

export interface MessagesEncodeOptions {
  readonly requestId: string
  /** The class the auction selected (a fallback provider may serve another). */
  readonly model: string
  readonly showThinking: boolean
  /** The router's prompt estimate, reported on `message_start` before the provider's count. */
  readonly inputTokensEstimate: number
  /** The auction metadata, the first (additive) event. */
  readonly svcCleared: Readonly<Record<string, unknown>>
  /** The `svc` object of the finished message (non-streaming body). */
  readonly svcFinal: (summary: ServeSummary) => Readonly<Record<string, unknown>>
  /** The `svc` object riding on the final `message_delta` (the charge). */
  readonly svcUsage: (summary: ServeSummary) => Readonly<Record<string, unknown>>
}

export interface MessagesEvent {
  readonly type: string
  readonly [field: string]: unknown
}

type Block =
  | { kind: "text"; index: number; text: string }
  | { kind: "thinking"; index: number; text: string }
  | { kind: "tool_use"; index: number; id: string; name: string; arguments: string }

export const stopReason = (reason: FinishReason | null): string => {
  switch (reason) {
    case "length":
      return "max_tokens"
    case "tool_calls":
      return "tool_use"
    case "content_filter":
      return "refusal"
    default:
      return "end_turn"
  }
}

/** Tool arguments as the Messages `input` object; anything that is not a JSON object becomes `{}`. */
export const toolInput = (args: string): unknown => {
  try {
    const parsed: unknown = JSON.parse(args)
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? parsed : {}
  } catch {
    return {}
  }
}

/** Messages usage: `input_tokens` excludes cache reads, which are reported beside it. */
export const messagesUsage = (summary: ServeSummary) => ({
  input_tokens: Math.max(0, summary.usage.promptTokens - summary.usage.cachedTokens),
  output_tokens: summary.usage.completionTokens,
  cache_creation_input_tokens: 0,
  cache_read_input_tokens: summary.usage.cachedTokens
})

export interface MessagesEncoder {
  /** The events before any served content: the auction metadata. */
  readonly start: () => ReadonlyArray<MessagesEvent>
  readonly push: (event: ServeEvent) => ReadonlyArray<MessagesEvent>
  /** The message as it stands (final once `End` was pushed). */
  readonly message: () => Record<string, unknown>
}

export const makeMessagesEncoder = (options: MessagesEncodeOptions): MessagesEncoder => {
  const hex = options.requestId.replace(/^req_/, "")
  const id = `msg_${hex}`
  const blocks: Array<Block> = []
  const tools = new Map<number, Extract<Block, { kind: "tool_use" }>>()
  let current: Block | undefined
  let started = false
  let sources: ReadonlyArray<UpstreamSource> = []
  let summary: ServeSummary | undefined

  const blockJson = (block: Block, done: boolean): Record<string, unknown> => {
    switch (block.kind) {
      case "text":
        return { type: "text", text: done ? block.text : "" }
      case "thinking":
        return { type: "thinking", thinking: done ? block.text : "", signature: "" }
      case "tool_use":
        return {
          type: "tool_use",
          id: block.id,
          name: block.name,
          input: done ? toolInput(block.arguments) : {}
        }
    }
  }

  const message = (): Record<string, unknown> => ({
    id,
    type: "message",
    role: "assistant",
    model: summary?.modelClass ?? options.model,
    content: summary === undefined ? [] : blocks.map((b) => blockJson(b, true)),
    // A reply the provider broke off has no reason to stop: `null`, and `svc.status` says `partial`.
    stop_reason: summary === undefined || wasCut(summary) ? null : stopReason(summary.finishReason),
    stop_sequence: null,
    usage:
      summary === undefined
        ? {
            input_tokens: options.inputTokensEstimate,
            output_tokens: 0,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0
          }
        : messagesUsage(summary),
    ...(sources.length > 0 ? { svc_sources: sources } : {}),
    ...(summary === undefined ? {} : { svc: options.svcFinal(summary) })
  })

  const closeCurrent = (out: Array<MessagesEvent>) => {
    if (current !== undefined) out.push({ type: "content_block_stop", index: current.index })
    current = undefined
  }

  const open = <B extends Block>(out: Array<MessagesEvent>, block: B): B => {
    closeCurrent(out)
    blocks.push(block)
    current = block
    out.push({ type: "content_block_start", index: block.index, content_block: blockJson(block, false) })
    return block
  }

  const openKind = (out: Array<MessagesEvent>, kind: "text" | "thinking") =>
    current?.kind === kind ? current : open(out, { kind, index: blocks.length, text: "" })

  const push = (served: ServeEvent): ReadonlyArray<MessagesEvent> => {
    const out: Array<MessagesEvent> = []
    if (!started) {
      started = true
      if (served._tag === "Delta" && served.event._tag === "Sources") {
        sources = served.event.sources
        out.push({ type: "message_start", message: message() })
        return out
      }
      out.push({ type: "message_start", message: message() })
    }
    if (served._tag === "End") {
      closeCurrent(out)
      summary = served.summary
      if (wasCut(summary) && summary.error !== null) {
        out.push({ type: "error", error: { type: "api_error", message: summary.error.message } })
        return out
      }
      out.push({
        type: "message_delta",
        delta: { stop_reason: stopReason(summary.finishReason), stop_sequence: null },
        usage: messagesUsage(summary),
        svc: options.svcUsage(summary)
      })
      out.push({ type: "message_stop" })
      return out
    }
    const e = served.event
    switch (e._tag) {
      case "Sources":
        sources = [...sources, ...e.sources]
        out.push({ type: "svc.sources", svc_sources: e.sources })
        break
      case "ReasoningDelta": {
        if (!options.showThinking) break
        const block = openKind(out, "thinking")
        if (block.kind === "thinking") block.text += e.text
        out.push({
          type: "content_block_delta",
          index: block.index,
          delta: { type: "thinking_delta", thinking: e.text }
        })
        break
      }
      case "TextDelta": {
        const block = openKind(out, "text")
        if (block.kind === "text") block.text += e.text
        out.push({
          type: "content_block_delta",
          index: block.index,
          delta: { type: "text_delta", text: e.text }
        })
        break
      }
      case "ToolCallDelta": {
        let block = tools.get(e.index)
        if (block === undefined) {
          block = open(out, {
            kind: "tool_use",
            index: blocks.length,
            id: e.id ?? `toolu_${hex}_${e.index}`,
            name: e.name ?? "",
            arguments: ""
          })
          tools.set(e.index, block)
        }
        block.arguments += e.argumentsDelta
        // A block already stopped takes no more deltas; its late pieces reach only the final message.
        if (e.argumentsDelta.length > 0 && current === block) {
          out.push({
            type: "content_block_delta",
            index: block.index,
            delta: { type: "input_json_delta", partial_json: e.argumentsDelta }
          })
        }
        break
      }
    }
    return out
  }

  const start = (): ReadonlyArray<MessagesEvent> => [{ type: "svc.auction_cleared", svc: options.svcCleared }]

  return { start, push, message }
}

/** The non-streaming body: every served event through the same machine. */
export const messagesBody = (options: MessagesEncodeOptions, events: ReadonlyArray<ServeEvent>) => {
  const encoder = makeMessagesEncoder(options)
  encoder.start()
  for (const event of events) encoder.push(event)
  return encoder.message()
}

export const messagesSseFrame = (event: MessagesEvent) =>
  `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`
