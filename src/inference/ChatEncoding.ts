import { paymentResponseHeader } from "../domain/X402.ts"
import { anonymizeBids } from "../market/Auction.ts"
import type { UpstreamSource } from "./Events.ts"
import type { Indexed } from "./LiveStreams.ts"
import {
  type Admitted,
  type AgentHeaders,
  type MeteredUsage,
  type ServeEvent,
  type ServeSummary,
  wasCut
} from "./Paid.ts"
import { type RichEnvelope, richEnvelope } from "./Rich.ts"

/** The chat-completions wire: the `svc` envelope, usage, the non-streaming body and SSE chunks. */
export const PRICE_UNIT = "base units (6 decimals) per 1,000,000 tokens"
const STEPS = ["route", "rfq", "award", "clear", "serve"] as const

export const svcEnvelope = (admitted: Admitted, servedBy?: { providerId: string; modelClass: string }) =>
  auctionSvc(admitted.auction, admitted.requestId, admitted.request.model, servedBy)

/**
 * The `svc` object of a served reply: the auction envelope, with the serve step and the receipt's
 * status as they ended (`svc.process` never says serve completed when the receipt says `partial`).
 */
export const servedSvc = (admitted: Admitted, summary: ServeSummary) => {
  const svc = svcEnvelope(admitted, { providerId: summary.providerId, modelClass: summary.modelClass })
  return {
    ...svc,
    process: svc.process.map((p) =>
      p.step === "serve" && summary.status !== "ok" ? { step: p.step, status: summary.status } : p
    ),
    status: summary.status,
    ...(summary.status !== "ok" && summary.error !== null ? { error: summary.error } : {})
  }
}

/** The `svc` object of any paid call (spec 2.3): routing, the auction as cleared, process, links. */
export const auctionSvc = (
  auction: Admitted["auction"],
  requestId: string,
  requestedModel: string,
  servedBy?: { providerId: string; modelClass: string },
  unit: string = PRICE_UNIT
) => {
  const anonymized = anonymizeBids(auction)
  return {
    request_id: requestId,
    routing: {
      requested_model: requestedModel,
      selected_model: servedBy?.modelClass ?? auction.winner.model_class
    },
    auction: {
      version: auction.version,
      mechanism: auction.mechanism,
      quotes_competing: auction.eligible,
      winner: {
        provider: servedBy?.providerId ?? auction.winner.provider_id,
        model: servedBy?.modelClass ?? auction.winner.model_class
      },
      price_setter: auction.priceSetter,
      bids: anonymized.bids.map((b) => ({
        rank: b.rank,
        provider: b.provider_id,
        model: b.model_class,
        price_in: b.price_in,
        price_out: b.price_out,
        outcome: b.outcome
      })),
      clear: { price_in: auction.clear.price_in, price_out: auction.clear.price_out, unit }
    },
    process: STEPS.map((step): { step: string; status: string } => ({ step, status: "completed" })),
    links: { receipt: `/v1/receipts/${requestId}`, auction: `/v1/analytics/requests/${requestId}` }
  }
}

/** Usage per spec 2.3; estimate markers only where a count is the router's own estimate. */
export const usageBody = (usage: MeteredUsage, charged: number) => {
  const estimates: Record<string, true> = {}
  if (usage.estimated.prompt) estimates.prompt_tokens = true
  if (usage.estimated.completion) estimates.completion_tokens = true
  if (usage.estimated.reasoning) estimates.reasoning_tokens = true
  return {
    prompt_tokens: usage.promptTokens,
    completion_tokens: usage.completionTokens,
    total_tokens: usage.promptTokens + usage.completionTokens,
    cost: charged / 1_000_000,
    ...(usage.cachedTokens > 0 ? { prompt_tokens_details: { cached_tokens: usage.cachedTokens } } : {}),
    completion_tokens_details: { reasoning_tokens: usage.reasoningTokens },
    ...(Object.keys(estimates).length > 0 ? { svc_estimates: estimates } : {})
  }
}

export interface Assembled {
  readonly text: string
  readonly reasoning: string
  readonly toolCalls: ReadonlyArray<{
    id: string
    type: "function"
    function: { name: string; arguments: string }
  }>
  readonly sources: ReadonlyArray<UpstreamSource>
  readonly summary: ServeSummary | undefined
}

export const assemble = (events: ReadonlyArray<ServeEvent>): Assembled => {
  let text = ""
  let reasoning = ""
  const calls = new Map<
    number,
    { id: string; type: "function"; function: { name: string; arguments: string } }
  >()
  const sources: Array<UpstreamSource> = []
  let summary: ServeSummary | undefined
  for (const e of events) {
    if (e._tag === "End") {
      summary = e.summary
      continue
    }
    const event = e.event
    if (event._tag === "TextDelta") text += event.text
    else if (event._tag === "ReasoningDelta") reasoning += event.text
    else if (event._tag === "Sources") sources.push(...event.sources)
    else {
      const call = calls.get(event.index) ?? {
        id: "",
        type: "function" as const,
        function: { name: "", arguments: "" }
      }
      if (event.id !== undefined) call.id = event.id
      if (event.name !== undefined) call.function.name = event.name
      call.function.arguments += event.argumentsDelta
      calls.set(event.index, call)
    }
  }
  const toolCalls = [...calls.entries()].sort(([a], [b]) => a - b).map(([, c]) => c)
  return { text, reasoning, toolCalls, sources, summary }
}

/** The non-streaming chat completion (spec 2.3). */
export const chatCompletionBody = (admitted: Admitted, assembled: Assembled, includeReasoning: boolean) => {
  const summary = assembled.summary!
  const message: Record<string, unknown> = {
    role: "assistant",
    content: assembled.toolCalls.length > 0 && assembled.text === "" ? null : assembled.text
  }
  if (includeReasoning && assembled.reasoning !== "") message.reasoning_content = assembled.reasoning
  if (assembled.toolCalls.length > 0) message.tool_calls = assembled.toolCalls
  const rich = richEnvelope(assembled.text, { sources: assembled.sources })
  return {
    id: `chatcmpl-${admitted.requestId.slice(4)}`,
    object: "chat.completion" as const,
    created: Math.floor(admitted.createdAt / 1000),
    model: summary.modelClass,
    choices: [
      { index: 0, message, finish_reason: wasCut(summary) ? "error" : (summary.finishReason ?? "stop") }
    ],
    usage: usageBody(summary.usage, summary.charged),
    // The provider-native grounding field, preserved as sent beside the validated `svc.rich`.
    ...(assembled.sources.length > 0 ? { svc_sources: assembled.sources } : {}),
    svc: {
      ...servedSvc(admitted, summary),
      ...(rich === undefined ? {} : { rich })
    }
  }
}

/** The text and sources an encoder has seen so far: what `svc.rich` is computed over. */
interface Seen {
  text: string
  readonly sources: Array<UpstreamSource>
}

const richOf = (seen: Seen): RichEnvelope | undefined => richEnvelope(seen.text, { sources: seen.sources })

const frame = (data: unknown, id?: number) =>
  `${id === undefined ? "" : `id: ${id}\n`}data: ${JSON.stringify(data)}\n\n`

/**
 * SSE frames for one served event; `index` is the event's position, the resume cursor. `seen` is what
 * came before it, and takes this event in (every event is pushed in order, from the first).
 */
const chatChunkFrames = (
  admitted: Admitted,
  indexed: Indexed<ServeEvent>,
  includeReasoning: boolean,
  seen: Seen
): string => {
  const base = {
    id: `chatcmpl-${admitted.requestId.slice(4)}`,
    object: "chat.completion.chunk" as const,
    created: Math.floor(admitted.createdAt / 1000),
    model: admitted.auction.winner.model_class
  }
  const { event, index } = indexed
  const richFrame = (rich: RichEnvelope, id?: number, native?: ReadonlyArray<UpstreamSource>) =>
    frame(
      {
        ...base,
        choices: [],
        ...(native === undefined ? {} : { svc_sources: native }),
        svc: { type: "rich", request_id: admitted.requestId, rich }
      },
      id
    )
  if (event._tag === "End") {
    const summary = event.summary
    const frames: Array<string> = []
    // The complete envelope, over the whole text, before the stream says it is finished.
    const rich = richOf(seen)
    if (rich !== undefined) frames.push(richFrame(rich))
    // A cut stream ends with its error chunk, which carries `finish_reason: "error"` (as the
    // OpenAI-compatible routers' mid-stream error does): no `stop` follows it (the usage frame still
    // says what was charged, and `[DONE]` closes the stream).
    if (wasCut(summary) && summary.error !== null) {
      frames.push(
        frame(
          {
            ...base,
            choices: [{ index: 0, delta: {}, finish_reason: "error" }],
            error: {
              message: summary.error.message,
              type: "upstream_error",
              code: summary.error.code,
              param: null
            }
          },
          index
        )
      )
    } else {
      frames.push(
        frame(
          { ...base, choices: [{ index: 0, delta: {}, finish_reason: summary.finishReason ?? "stop" }] },
          index
        )
      )
    }
    frames.push(
      frame({
        ...base,
        model: summary.modelClass,
        choices: [],
        usage: usageBody(summary.usage, summary.charged),
        svc: {
          type: "usage",
          request_id: admitted.requestId,
          status: summary.status,
          charged: summary.charged,
          authorized: summary.authorized
        }
      })
    )
    frames.push("data: [DONE]\n\n")
    return frames.join("")
  }
  const e = event.event
  if (e._tag === "TextDelta") seen.text += e.text
  if (e._tag === "Sources") seen.sources.push(...e.sources)
  if (e._tag === "TextDelta") {
    return frame({ ...base, choices: [{ index: 0, delta: { content: e.text }, finish_reason: null }] }, index)
  }
  if (e._tag === "ReasoningDelta") {
    // Raw reasoning is metered either way but reaches the caller only when asked for.
    if (!includeReasoning) return ""
    return frame(
      { ...base, choices: [{ index: 0, delta: { reasoning_content: e.text }, finish_reason: null }] },
      index
    )
  }
  if (e._tag === "Sources") {
    const rich = richOf(seen)
    return rich === undefined ? "" : richFrame(rich, index, e.sources)
  }
  const toolCall: Record<string, unknown> = { index: e.index, function: { arguments: e.argumentsDelta } }
  if (e.id !== undefined) toolCall.id = e.id
  if (e.id !== undefined) toolCall.type = "function"
  if (e.name !== undefined) (toolCall.function as Record<string, unknown>).name = e.name
  return frame(
    { ...base, choices: [{ index: 0, delta: { tool_calls: [toolCall] }, finish_reason: null }] },
    index
  )
}

/** The chat-completions SSE of one reply: the `auction_cleared` chunk, then each event's chunks in order. */
export const makeChatEncoder = (admitted: Admitted, includeReasoning: boolean) => {
  const seen: Seen = { text: "", sources: [] }
  return {
    start: () => [auctionClearedFrame(admitted)],
    push: (event: ServeEvent, index: number) => {
      const frames = chatChunkFrames(admitted, { index, event }, includeReasoning, seen)
      return frames.length > 0 ? [frames] : []
    }
  }
}

/** The first SSE chunk: the auction that cleared, with the executable quotes that competed. */
export const auctionClearedFrame = (admitted: Admitted) =>
  frame({
    id: `chatcmpl-${admitted.requestId.slice(4)}`,
    object: "chat.completion.chunk",
    created: Math.floor(admitted.createdAt / 1000),
    model: admitted.auction.winner.model_class,
    choices: [],
    svc: { type: "auction_cleared", ...svcEnvelope(admitted) }
  })

/** What the paid-call headers are made of (a completion's `Admitted`, or a generated image). */
export interface PaidHeadersInput {
  readonly requestId: string
  readonly auction: Admitted["auction"]
  readonly funding: Admitted["funding"]
  readonly streamToken?: string | undefined
  readonly sessionToken?: string | undefined
}

/** Response headers of a paid call (spec 4.1). */
export const paidHeaders = (
  admitted: PaidHeadersInput,
  agent: AgentHeaders,
  network: string
): Record<string, string> => {
  const { auction } = admitted
  const headers: Record<string, string> = {
    "x-request-id": admitted.requestId,
    "x-routing-model": auction.winner.model_class,
    "x-clear-price-in": String(auction.clear.price_in),
    "x-clear-price-out": String(auction.clear.price_out),
    "x-svc-auction-version": auction.version,
    "x-svc-quotes-competing": String(auction.eligible),
    "x-svc-price-setter": auction.priceSetter,
    "x-svc-service-premium-cap-bps": String(auction.premiumCapBps)
  }
  if (admitted.streamToken !== undefined) headers["x-stream-token"] = admitted.streamToken
  const funding = admitted.funding
  if (admitted.sessionToken !== undefined) headers["x-session-token"] = admitted.sessionToken
  if (funding._tag === "Credit") {
    headers["x-key-budget-remaining"] = String(funding.keyRemaining)
  } else if (funding._tag === "Session") {
    headers["x-session-budget-remaining"] = String(funding.budgetRemaining)
  } else {
    // The transfer is submitted after the response (off its path); the receipt carries the hash.
    headers["payment-response"] = paymentResponseHeader({
      success: true,
      transaction: "",
      network,
      payer: funding.payment.payer,
      amount: funding.payment.value
    })
  }
  if (agent.role !== undefined) headers["x-routing-agent-role"] = agent.role
  if (agent.parentTask !== undefined) headers["x-routing-parent-task"] = agent.parentTask
  if (agent.agentId !== undefined) headers["x-routing-agent-id"] = agent.agentId
  return headers
}
