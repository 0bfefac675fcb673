import type { TokenCounts } from "../domain/Billing.ts"
import type { RankedBid } from "../market/Auction.ts"
import type { FinishReason, UpstreamEvent } from "./Events.ts"
import type { MeteredUsage } from "./Paid.ts"
import { countTextTokens } from "./Tokens.ts"

type Usage = Extract<UpstreamEvent, { _tag: "Usage" }>
type Sources = Extract<UpstreamEvent, { _tag: "Sources" }>

/** What serving one request has observed so far: who serves, what was delivered, what the provider said. */
export interface Meter {
  servedBy: RankedBid
  delivered: boolean
  firstTokenAt: number
  /** Delivered text and tool-call pieces: the tokenizer's count when the provider reports none. */
  pieces: Array<string>
  reasoning: Array<string>
  usage: Usage | undefined
  finish: FinishReason | null
  error: { code: string; message: string } | null
  /** Grounding held until a token proves this provider is serving (a fallback must not repeat it). */
  heldSources: Sources | undefined
  /** When the delivered charge was last recorded durably (`ledger/Metered.ts`), and whether a write is in flight. */
  checkpointedAt: number
  checkpointing: boolean
}

export const newMeter = (winner: RankedBid): Meter => ({
  servedBy: winner,
  delivered: false,
  firstTokenAt: 0,
  pieces: [],
  reasoning: [],
  usage: undefined,
  finish: null,
  error: null,
  heldSources: undefined,
  checkpointedAt: 0,
  checkpointing: false
})

/** Notes a delivered content event for the tokenizer's fallback count. */
export const recordContent = (meter: Meter, event: UpstreamEvent) => {
  if (event._tag === "TextDelta") meter.pieces.push(event.text)
  else if (event._tag === "ReasoningDelta") meter.reasoning.push(event.text)
  else if (event._tag === "ToolCallDelta") meter.pieces.push((event.name ?? "") + event.argumentsDelta)
}

/**
 * The metered usage of a served request. Provider-reported counts are trusted only when they are
 * sane (non-negative safe integers, and never more output than the caller allowed); a missing count is
 * the router's tokenizer estimate. A session's provider committed to hold the conversation so far
 * (`session_ttl_s`): that prefix bills at the cached rate whatever the provider reports.
 */
export const meteredUsage = (
  meter: Meter,
  input: { readonly maxTokens: number; readonly promptEstimate: number; readonly cachedEstimate: number }
): MeteredUsage => {
  const sane = (n: number | undefined, max = Number.MAX_SAFE_INTEGER) =>
    n !== undefined && Number.isSafeInteger(n) && n >= 0 ? Math.min(n, max) : undefined
  const raw = meter.usage
  const reported =
    raw === undefined
      ? undefined
      : {
          inputTokens: sane(raw.inputTokens),
          outputTokens: sane(raw.outputTokens, input.maxTokens),
          reasoningTokens: sane(raw.reasoningTokens, input.maxTokens),
          cachedInputTokens: sane(raw.cachedInputTokens)
        }
  const reasoningText = meter.reasoning.join("")
  const reasoningEstimate = reasoningText.length > 0 ? countTextTokens(reasoningText) : 0
  return {
    promptTokens: reported?.inputTokens ?? input.promptEstimate,
    completionTokens: reported?.outputTokens ?? countTextTokens(meter.pieces.join("")) + reasoningEstimate,
    reasoningTokens: reported?.reasoningTokens ?? reasoningEstimate,
    cachedTokens: Math.max(reported?.cachedInputTokens ?? 0, input.cachedEstimate),
    estimated: {
      prompt: reported?.inputTokens === undefined,
      completion: reported?.outputTokens === undefined,
      reasoning: reported?.reasoningTokens === undefined && reasoningEstimate > 0
    }
  }
}

/** The tokens a metered usage bills: the cached part never exceeds the prompt. */
export const billableTokens = (usage: MeteredUsage): TokenCounts => ({
  input: usage.promptTokens,
  cachedInput: Math.min(usage.cachedTokens, usage.promptTokens),
  output: usage.completionTokens
})
