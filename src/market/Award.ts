/**
 * The award step (pure): each eligible quote is scored (its own cost times the profile's multiplier
 * for quality and measured latency), the profile's restriction applies (`best`'s quality band, the
 * deadline mechanism's cheapest feasible class), and bids are ranked with one bid per provider.
 */
import type { SignedQuote } from "../domain/Quote.ts"
import type { Exclusion, ExclusionReason, RankedBid, ScoreBreakdown } from "./AuctionRecords.ts"
import type { ModelClass } from "./Catalog.ts"
import type { LatencyEstimate } from "./LatencyStats.ts"
import { DEADLINE_MECHANISM_VERSION, PROFILES, type ProfileWeights, type Route } from "./Route.ts"
import { qualityShift, type TaskFit } from "./TaskFit.ts"

/** The TTFT quantile used in scores (an SLO uses its own confidence). */
export const SCORING_LATENCY_QUANTILE = 0.9
/** Latency penalty is 0 at or below the floor and 1 at or above the ceiling, logarithmic between. */
export const LATENCY_FLOOR_MS = 200
export const LATENCY_CEILING_MS = 10_000

export interface Candidate {
  readonly quote: SignedQuote
  readonly modelClass: ModelClass
  readonly cost: number
  readonly score: bigint
  /** `score` as a number when it is a safe integer (then exact), else NaN: compared before the bigint. */
  readonly scoreNumber: number
  readonly breakdown: ScoreBreakdown
}

const roundPenalty = (x: number): number => Math.round(Math.min(1, Math.max(0, x)) * 1e6) / 1e6

/** 0 at or below LATENCY_FLOOR_MS, 1 at or above LATENCY_CEILING_MS (or unknown), logarithmic between. */
export const latencyPenalty = (latencyMs: number): number =>
  Number.isFinite(latencyMs)
    ? roundPenalty(Math.log(latencyMs / LATENCY_FLOOR_MS) / Math.log(LATENCY_CEILING_MS / LATENCY_FLOOR_MS))
    : 1

export const qualityPenalty = (quality: number): number => roundPenalty(1 - quality)

/** The profile's score multiplier in basis points, always within [10000, premiumCapBps]. */
export const multiplierBps = (
  weights: ProfileWeights,
  qualityPenaltyValue: number,
  latencyPenaltyValue: number
) => {
  const penalty = weights.qualityWeight * qualityPenaltyValue + weights.latencyWeight * latencyPenaltyValue
  return 10_000 + Math.round((weights.premiumCapBps - 10_000) * Math.min(1, Math.max(0, penalty)))
}

export const scoreCandidate = (
  quote: SignedQuote,
  modelClass: ModelClass,
  cost: number,
  weights: ProfileWeights,
  latency: LatencyEstimate,
  taskFit?: TaskFit | undefined
): Candidate => {
  const latencyMs = Math.round(latency.quantile(SCORING_LATENCY_QUANTILE))
  const evidence = taskFit?.evidence(modelClass.id)
  const shift = taskFit === undefined ? 0 : qualityShift(modelClass.quality, evidence)
  const quality = shift === 0 ? modelClass.quality : Math.round((modelClass.quality + shift) * 1e6) / 1e6
  const breakdown = {
    cost,
    quality,
    quality_penalty: qualityPenalty(quality),
    latency_ms: latencyMs,
    latency_quantile: SCORING_LATENCY_QUANTILE,
    latency_penalty: latencyPenalty(latencyMs),
    maturity: latency.maturity
  }
  const multiplier = multiplierBps(weights, breakdown.quality_penalty, breakdown.latency_penalty)
  const product = cost * multiplier
  const safe = Number.isSafeInteger(product)
  return {
    quote,
    modelClass,
    cost,
    score: safe ? BigInt(product) : BigInt(cost) * BigInt(multiplier),
    scoreNumber: safe ? product : Number.NaN,
    breakdown: {
      ...breakdown,
      multiplier_bps: multiplier,
      ...(taskFit === undefined
        ? {}
        : {
            task_fit: {
              task: taskFit.task,
              ratings: evidence?.ratings ?? 0,
              mean: evidence === undefined ? null : evidence.mean,
              catalog_quality: modelClass.quality,
              quality_shift: shift
            }
          })
    }
  }
}

export const compareStrings = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** Total order: score, then own cost, then quote id, then provider id. */
export const compareCandidates = (a: Candidate, b: Candidate): number =>
  (Number.isNaN(a.scoreNumber) || Number.isNaN(b.scoreNumber)
    ? a.score < b.score
      ? -1
      : a.score > b.score
        ? 1
        : 0
    : a.scoreNumber - b.scoreNumber) ||
  a.cost - b.cost ||
  compareStrings(a.quote.quote_id, b.quote.quote_id) ||
  compareStrings(a.quote.provider_id, b.quote.provider_id)

/** `best` keeps the top quality band; `deadline-price/1` keeps the class of the cheapest feasible quote. */
const profileRestriction = (
  candidates: ReadonlyArray<Candidate>,
  route: Route
): { keep: (c: Candidate) => boolean; reason: ExclusionReason } | undefined => {
  if (route.version === DEADLINE_MECHANISM_VERSION) {
    // Under deadline-price the profile is `cheapest`, so score order is cost order.
    const cheapestClass = [...candidates].sort(compareCandidates).at(0)?.modelClass.id
    return { keep: (c) => c.modelClass.id === cheapestClass, reason: "class_not_selected" }
  }
  const band = PROFILES[route.profile].qualityBand
  if (band === undefined) return undefined
  // The quality scored: a task's ratings move the band as they move the score (D232).
  const top = Math.max(...candidates.map((c) => c.breakdown.quality))
  return { keep: (c) => c.breakdown.quality >= top - band - 1e-9, reason: "below_quality_tier" }
}

export const restrictToProfile = (
  candidates: ReadonlyArray<Candidate>,
  route: Route
): { kept: ReadonlyArray<Candidate>; dropped: ReadonlyArray<Exclusion> } => {
  const restriction = profileRestriction(candidates, route)
  if (restriction === undefined) return { kept: candidates, dropped: [] }
  const { keep, reason } = restriction
  return {
    kept: candidates.filter(keep),
    dropped: candidates.filter((c) => !keep(c)).map((c) => ({ quote_id: c.quote.quote_id, reason }))
  }
}

/** Ranks bids and keeps each provider's best one, so a provider never sets its own price. */
export const rankIndependentBids = (
  candidates: ReadonlyArray<Candidate>,
  first: Candidate | undefined
): { ranked: ReadonlyArray<Candidate>; dropped: ReadonlyArray<Exclusion> } => {
  const ordered = [...candidates].sort(compareCandidates)
  const sequence = first === undefined ? ordered : [first, ...ordered.filter((c) => c !== first)]
  const seen = new Set<string>()
  const ranked: Array<Candidate> = []
  const dropped: Array<Exclusion> = []
  for (const c of sequence) {
    if (seen.has(c.quote.provider_id))
      dropped.push({ quote_id: c.quote.quote_id, reason: "provider_better_quote" })
    else {
      seen.add(c.quote.provider_id)
      ranked.push(c)
    }
  }
  return { ranked, dropped }
}

export const toBid = (c: Candidate, index: number): RankedBid => ({
  rank: index + 1,
  quote_id: c.quote.quote_id,
  provider_id: c.quote.provider_id,
  model_class: c.quote.model_class,
  price_in: c.quote.price_in,
  price_out: c.quote.price_out,
  ...(c.quote.price_in_cached === undefined ? {} : { price_in_cached: c.quote.price_in_cached }),
  score: Number(c.score) / 10_000,
  score_breakdown: c.breakdown,
  outcome: index === 0 ? "won" : "lost"
})
