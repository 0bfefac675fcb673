import type { ResponsesRequest } from "../../domain/Responses.ts"
import type { UpstreamSource } from "../Events.ts"
import type { MeteredUsage, ServeEvent, ServeSummary } from "../Paid.ts"
import { citationAnnotations, type UrlCitation } from "./Citations.ts"

/**
 * Served events as the OpenAI Responses API: one state machine yields the streamed event
 * sequence, and its final `response` is also the non-streaming body, so both shapes agree.
 */

export interface ResponsesEncodeOptions {
  readonly requestId: string
  /** Milliseconds. */
  readonly createdAt: number
  /** The class the auction selected (a fallback provider may serve another). */
  readonly model: string
  readonly showReasoning: boolean
  /** Request fields echoed on the response object, as the Responses API does. */
  readonly echo: Readonly<Record<string, unknown>>
  /** The auction metadata, carried by the first event. */
  readonly svcCleared: Readonly<Record<string, unknown>>
  /** The `svc` object of the finished response. */
  readonly svcFinal: (summary: ServeSummary) => Readonly<Record<string, unknown>>
}

export interface ResponsesEvent {
  readonly type: string
  readonly sequence_number: number
  readonly [field: string]: unknown
}

type Item =
  | {
      kind: "message"
      id: string
      outputIndex: number
      text: string
      annotations: ReadonlyArray<UrlCitation>
    }
  | { kind: "reasoning"; id: string; outputIndex: number; text: string }
  | {
      kind: "function_call"
      id: string
      outputIndex: number
      callId: string
      name: string
      arguments: string
    }

/** Request fields the response object echoes (defaults as the Responses API reports them). */
export const responsesEcho = (request: ResponsesRequest): Record<string, unknown> => ({
  instructions: request.instructions ?? null,
  max_output_tokens: request.max_output_tokens ?? null,
  parallel_tool_calls: request.parallel_tool_calls ?? true,
  previous_response_id: null,
  reasoning: { effort: request.reasoning?.effort ?? null, summary: request.reasoning?.summary ?? null },
  store: false,
  temperature: request.temperature ?? null,
  text: { format: request.text?.format ?? { type: "text" } },
  tool_choice: request.tool_choice ?? "auto",
  tools: request.tools ?? [],
  top_p: request.top_p ?? null,
  truncation: "disabled",
  metadata: {}
})

export const responsesUsage = (usage: MeteredUsage, charged: number) => {
  const estimates: Record<string, true> = {}
  if (usage.estimated.prompt) estimates.input_tokens = true
  if (usage.estimated.completion) estimates.output_tokens = true
  if (usage.estimated.reasoning) estimates.reasoning_tokens = true
  return {
    input_tokens: usage.promptTokens,
    input_tokens_details: { cached_tokens: usage.cachedTokens },
    output_tokens: usage.completionTokens,
    output_tokens_details: { reasoning_tokens: usage.reasoningTokens },
    total_tokens: usage.promptTokens + usage.completionTokens,
    cost: charged / 1_000_000,
    ...(Object.keys(estimates).length > 0 ? { svc_estimates: estimates } : {})
  }
}

const outcome = (summary: ServeSummary) => {
  if (summary.status === "partial" && summary.error !== null) {
    return {
      event: "response.failed",
      status: "failed",
      error: { code: "server_error", message: summary.error.message },
      incomplete_details: null
    }
  }
  if (summary.finishReason === "length" || summary.finishReason === "content_filter") {
    return {
      event: "response.incomplete",
      status: "incomplete",
      error: null,
      incomplete_details: {
        reason: summary.finishReason === "length" ? "max_output_tokens" : "content_filter"
      }
    }
  }
  return { event: "response.completed", status: "completed", error: null, incomplete_details: null }
}

export interface ResponsesEncoder {
  /** The events before any served content: `response.created` (with the auction), `response.in_progress`. */
  readonly start: () => ReadonlyArray<ResponsesEvent>
  readonly push: (event: ServeEvent) => ReadonlyArray<ResponsesEvent>
  /** The response object as it stands (final once `End` was pushed). */
  readonly response: () => Record<string, unknown>
}

export const makeResponsesEncoder = (options: ResponsesEncodeOptions): ResponsesEncoder => {
  const hex = options.requestId.replace(/^req_/, "")
  const id = `resp_${hex}`
  let sequence = 0
  const items: Array<Item> = []
  const calls = new Map<number, Extract<Item, { kind: "function_call" }>>()
  const closed = new Set<Item>()
  let current: Extract<Item, { kind: "message" | "reasoning" }> | undefined
  let sources: ReadonlyArray<UpstreamSource> = []
  let summary: ServeSummary | undefined

  const event = (out: Array<ResponsesEvent>, type: string, fields: Record<string, unknown>) => {
    out.push({ type, sequence_number: sequence++, ...fields })
  }

  const outputText = (item: Extract<Item, { kind: "message" }>) => ({
    type: "output_text",
    text: item.text,
    annotations: item.annotations,
    logprobs: []
  })

  const itemJson = (item: Item): Record<string, unknown> => {
    const done = closed.has(item)
    const status = done ? "completed" : "in_progress"
    switch (item.kind) {
      case "message":
        return {
          type: "message",
          id: item.id,
          status,
          role: "assistant",
          content: done ? [outputText(item)] : []
        }
      case "reasoning":
        return {
          type: "reasoning",
          id: item.id,
          summary: [],
          content: done ? [{ type: "reasoning_text", text: item.text }] : [],
          status
        }
      case "function_call":
        return {
          type: "function_call",
          id: item.id,
          call_id: item.callId,
          name: item.name,
          arguments: done ? item.arguments : "",
          status
        }
    }
  }

  const response = (): Record<string, unknown> => {
    const result = summary === undefined ? undefined : outcome(summary)
    return {
      id,
      object: "response",
      created_at: Math.floor(options.createdAt / 1000),
      status: result?.status ?? "in_progress",
      error: result?.error ?? null,
      incomplete_details: result?.incomplete_details ?? null,
      model: summary?.modelClass ?? options.model,
      output: items.map(itemJson),
      ...options.echo,
      usage: summary === undefined ? null : responsesUsage(summary.usage, summary.charged),
      ...(sources.length > 0 ? { svc_sources: sources } : {}),
      svc: summary === undefined ? options.svcCleared : options.svcFinal(summary)
    }
  }

  const close = (out: Array<ResponsesEvent>, item: Item) => {
    if (closed.has(item)) return
    const where = { item_id: item.id, output_index: item.outputIndex }
    if (item.kind === "message") {
      item.annotations = citationAnnotations(item.text, sources)
      event(out, "response.output_text.done", { ...where, content_index: 0, text: item.text, logprobs: [] })
      item.annotations.forEach((annotation, annotation_index) => {
        event(out, "response.output_text.annotation.added", {
          ...where,
          content_index: 0,
          annotation_index,
          annotation
        })
      })
      closed.add(item)
      event(out, "response.content_part.done", { ...where, content_index: 0, part: outputText(item) })
    } else if (item.kind === "reasoning") {
      event(out, "response.reasoning_text.done", { ...where, content_index: 0, text: item.text })
      closed.add(item)
      event(out, "response.content_part.done", {
        ...where,
        content_index: 0,
        part: { type: "reasoning_text", text: item.text }
      })
    } else {
      event(out, "response.function_call_arguments.done", {
        ...where,
        name: item.name,
        arguments: item.arguments
      })
      closed.add(item)
    }
    event(out, "response.output_item.done", { output_index: item.outputIndex, item: itemJson(item) })
  }

  const closeCurrent = (out: Array<ResponsesEvent>) => {
    if (current !== undefined) close(out, current)
    current = undefined
  }

  const open = <I extends Item>(out: Array<ResponsesEvent>, item: I): I => {
    items.push(item)
    event(out, "response.output_item.added", { output_index: item.outputIndex, item: itemJson(item) })
    if (item.kind !== "function_call") {
      event(out, "response.content_part.added", {
        item_id: item.id,
        output_index: item.outputIndex,
        content_index: 0,
        part:
          item.kind === "message"
            ? { type: "output_text", text: "", annotations: [], logprobs: [] }
            : { type: "reasoning_text", text: "" }
      })
    }
    return item
  }

  const openCurrent = (out: Array<ResponsesEvent>, kind: "message" | "reasoning") => {
    if (current?.kind === kind) return current
    closeCurrent(out)
    const outputIndex = items.length
    const item: Extract<Item, { kind: "message" | "reasoning" }> =
      kind === "message"
        ? { kind, id: `msg_${hex}_${outputIndex}`, outputIndex, text: "", annotations: [] }
        : { kind, id: `rs_${hex}_${outputIndex}`, outputIndex, text: "" }
    current = open(out, item)
    return current
  }

  const push = (served: ServeEvent): ReadonlyArray<ResponsesEvent> => {
    const out: Array<ResponsesEvent> = []
    if (served._tag === "End") {
      closeCurrent(out)
      for (const call of calls.values()) close(out, call)
      summary = served.summary
      const snapshot = response()
      event(out, outcome(served.summary).event, { response: snapshot })
      return out
    }
    const e = served.event
    switch (e._tag) {
      case "Sources":
        sources = [...sources, ...e.sources]
        break
      case "ReasoningDelta": {
        if (!options.showReasoning) break
        const item = openCurrent(out, "reasoning")
        item.text += e.text
        event(out, "response.reasoning_text.delta", {
          item_id: item.id,
          output_index: item.outputIndex,
          content_index: 0,
          delta: e.text
        })
        break
      }
      case "TextDelta": {
        const item = openCurrent(out, "message")
        item.text += e.text
        event(out, "response.output_text.delta", {
          item_id: item.id,
          output_index: item.outputIndex,
          content_index: 0,
          delta: e.text,
          logprobs: []
        })
        break
      }
      case "ToolCallDelta": {
        let call = calls.get(e.index)
        if (call === undefined) {
          closeCurrent(out)
          const outputIndex = items.length
          call = open(out, {
            kind: "function_call",
            id: `fc_${hex}_${outputIndex}`,
            outputIndex,
            callId: e.id ?? `call_${hex}_${e.index}`,
            name: e.name ?? "",
            arguments: ""
          })
          calls.set(e.index, call)
        }
        if (e.argumentsDelta.length > 0 && !closed.has(call)) {
          call.arguments += e.argumentsDelta
          event(out, "response.function_call_arguments.delta", {
            item_id: call.id,
            output_index: call.outputIndex,
            delta: e.argumentsDelta
          })
        }
        break
      }
    }
    return out
  }

  // The auction metadata rides on the first event, `response.created` (its `response.svc`), not
  // on an event of its own: the official openai-node `responses.stream()` helper throws on any
  // event type it does not know.
  const start = (): ReadonlyArray<ResponsesEvent> => {
    const out: Array<ResponsesEvent> = []
    event(out, "response.created", { response: response() })
    event(out, "response.in_progress", { response: response() })
    return out
  }

  return { start, push, response }
}

/** The non-streaming body: every served event through the same machine. */
export const responsesBody = (options: ResponsesEncodeOptions, events: ReadonlyArray<ServeEvent>) => {
  const encoder = makeResponsesEncoder(options)
  encoder.start()
  for (const event of events) encoder.push(event)
  return encoder.response()
}

export const responsesSseFrame = (event: ResponsesEvent) =>
  `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`
