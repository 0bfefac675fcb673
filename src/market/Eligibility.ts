/**
 * Which live quotes may compete (pure): a quote is excluded when its class is unknown or lacks what
 * the request needs, when it expired, sits at its signed capacity, cannot hold the context, asks
 * more than its class's phantom reserve, or misses the latency SLO. A session-locked quote skips the
 * market-level filters. What depends on the class only (reserve, requirements, scored quality) is
 * worked out once per class per auction (`classTerms`), not once per quote.
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
import { type Catalog, type ModelClass, missingCapabilities } from "./Catalog.ts"
import { type ClassTerms, compareStrings, qualityPenalty } from "./Scoring.ts"
import { qualityShift } from "./TaskFit.ts"

export const reserveCostOf = (modelClass: ModelClass, tokens: ScoringTokens): number | null =>
  modelClass.reserve === undefined
    ? null
    : worstCase(tokens.promptTokens, tokens.maxTokens, modelClass.reserve)

const termsOf = (modelClass: ModelClass, request: AuctionRequest): ClassTerms => {
  const { taskFit } = request
  const evidence = taskFit?.evidence(modelClass.id)
  const shift = taskFit === undefined ? 0 : qualityShift(modelClass.quality, evidence)
  const quality = shift === 0 ? modelClass.quality : Math.round((modelClass.quality + shift) * 1e6) / 1e6
  return {
    modelClass,
    reserve: reserveCostOf(modelClass, request),
    unmet:
      request.minQuality !== undefined && modelClass.quality < request.minQuality
        ? "below_min_quality"
        : missingCapabilities(modelClass, request.requiredCapabilities ?? []).length > 0
          ? "missing_capability"
          : undefined,
    quality,
    qualityPenalty: qualityPenalty(quality),
    taskFit:
      taskFit === undefined
        ? undefined
        : {
            task: taskFit.task,
            ratings: evidence?.ratings ?? 0,
            mean: evidence === undefined ? null : evidence.mean,
            catalog_quality: modelClass.quality,
            quality_shift: shift
          }
  }
}

/** Each catalog class's terms for this request, by class id (the first class of an id, as `findClass`). */
export const classTerms = (catalog: Catalog, request: AuctionRequest): ReadonlyMap<string, ClassTerms> => {
  const terms = new Map<string, ClassTerms>()
  for (const modelClass of catalog)
    if (!terms.has(modelClass.id)) terms.set(modelClass.id, termsOf(modelClass, request))
  return terms
}

/**
 * Why a quote of a known class cannot compete, the latency SLO aside (the caller asks the SLO last, so
 * a quote excluded earlier costs no latency lookup), or undefined. A session-locked quote skips the
 * market-level filters.
 */
export const exclusionReason = (
  live: LiveQuote,
  terms: ClassTerms,
  request: AuctionRequest,
  cost: number,
  locked: boolean
): ExclusionReason | undefined => {
  const { quote } = live
  if (!locked && terms.unmet !== undefined) return terms.unmet
  if (quote.valid_until * 1000 <= request.nowMs) return "expired"
  if (live.inFlight >= quote.capacity_rps) return "at_capacity"
  if (Math.min(quote.max_context, terms.modelClass.max_context) < request.promptTokens + request.maxTokens)
    return "context_too_small"
  if (!locked && terms.reserve !== null && cost > terms.reserve) return "above_reserve"
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
