/**
 * Which live quotes may compete (pure): a quote is excluded when its class is unknown or lacks what
 * the request needs, when it expired, sits at its signed capacity, cannot hold the context, asks
 * more than its class's phantom reserve, or misses the latency SLO. A session-locked quote skips the
 * market-level filters.
 */
import { worstCase } from "../domain/Billing.ts"
import type { SignedQuote } from "../domain/Quote.ts"
import type {
  AuctionRequest,
  Exclusion,
  ExclusionReason,
  LiveQuote,
  NoEligibleReason,
  ScoringTokens,
  SessionLock
} from "./AuctionRecords.ts"
import { compareStrings } from "./Award.ts"
import { type ModelClass, missingCapabilities } from "./Catalog.ts"
import type { LatencyEstimate } from "./LatencyStats.ts"

export const reserveCostOf = (modelClass: ModelClass, tokens: ScoringTokens): number | null =>
  modelClass.reserve === undefined
    ? null
    : worstCase(tokens.promptTokens, tokens.maxTokens, modelClass.reserve)

export /** Why a quote cannot compete, or undefined. A session-locked quote skips the market-level filters. */
const exclusionReason = (
  live: LiveQuote,
  modelClass: ModelClass,
  request: AuctionRequest,
  cost: number,
  latency: LatencyEstimate,
  locked: boolean,
  /** The class's reserve cost for this request (`reserveCostOf`), computed once per class by the caller. */
  reserve: number | null = reserveCostOf(modelClass, request)
): ExclusionReason | undefined => {
  const { quote } = live
  const needed = request.promptTokens + request.maxTokens
  if (!locked && request.minQuality !== undefined && modelClass.quality < request.minQuality)
    return "below_min_quality"
  if (!locked && missingCapabilities(modelClass, request.requiredCapabilities ?? []).length > 0)
    return "missing_capability"
  if (quote.valid_until * 1000 <= request.nowMs) return "expired"
  if (live.inFlight >= quote.capacity_rps) return "at_capacity"
  if (Math.min(quote.max_context, modelClass.max_context) < needed) return "context_too_small"
  if (locked) return undefined
  if (reserve !== null && cost > reserve) return "above_reserve"
  const slo = request.latencySlo
  if (slo !== undefined && !(latency.quantile(slo.confidence) <= slo.deadlineMs)) return "latency_slo"
  return undefined
}

export const byQuoteId = (a: Exclusion, b: Exclusion): number =>
  compareStrings(a.quote_id, b.quote_id) || compareStrings(a.reason, b.reason)

const REQUIREMENT_REASONS: ReadonlyArray<ExclusionReason> = [
  "unknown_class",
  "below_min_quality",
  "missing_capability",
  "context_too_small"
]

export const noEligibleReason = (
  considered: number,
  excluded: ReadonlyArray<Exclusion>
): NoEligibleReason => {
  if (considered === 0) return "no_quotes"
  if (excluded.some((e) => e.reason === "latency_slo")) return "latency_slo_infeasible"
  if (excluded.every((e) => REQUIREMENT_REASONS.includes(e.reason))) return "requirements_unmet"
  return "no_eligible_quote"
}

export const isLockedQuote = (quote: SignedQuote, lock: SessionLock | undefined): boolean =>
  lock !== undefined && quote.provider_id === lock.providerId && quote.model_class === lock.modelClass
