/**
 * The scoring terms of the auction (pure): the latency and quality penalties, the profile's score
 * multiplier, and what every quote of one class shares in one auction. The award step (`Award.ts`) and
 * the candidate arrays (`Candidates.ts`) both read them.
 */
import type { ExclusionReason, TaskFitBreakdown } from "./AuctionRecords.ts"
import type { ModelClass } from "./Catalog.ts"
import type { ProfileWeights } from "./Route.ts"

/** The TTFT quantile used in scores (an SLO uses its own confidence). */
export const SCORING_LATENCY_QUANTILE = 0.9
/** Latency penalty is 0 at or below the floor and 1 at or above the ceiling, logarithmic between. */
export const LATENCY_FLOOR_MS = 200
export const LATENCY_CEILING_MS = 10_000
const LOG_LATENCY_RANGE = Math.log(LATENCY_CEILING_MS / LATENCY_FLOOR_MS)

const roundPenalty = (x: number): number => Math.round(Math.min(1, Math.max(0, x)) * 1e6) / 1e6

const penaltyOf = (latencyMs: number): number =>
  Number.isFinite(latencyMs) ? roundPenalty(Math.log(latencyMs / LATENCY_FLOOR_MS) / LOG_LATENCY_RANGE) : 1
/** The penalty of every whole millisecond up to the ceiling, computed once (a score rounds to the ms). */
const PENALTY_BY_MS = Float64Array.from({ length: LATENCY_CEILING_MS + 1 }, (_, ms) => penaltyOf(ms))

/** 0 at or below LATENCY_FLOOR_MS, 1 at or above LATENCY_CEILING_MS (or unknown), logarithmic between. */
export const latencyPenalty = (latencyMs: number): number =>
  Number.isInteger(latencyMs) && latencyMs >= 0 && latencyMs <= LATENCY_CEILING_MS
    ? PENALTY_BY_MS[latencyMs]!
    : penaltyOf(latencyMs)

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

export const compareStrings = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** What every quote of one class shares in one auction, computed once per class (`Eligibility.classTerms`). */
export interface ClassTerms {
  readonly modelClass: ModelClass
  /** The class's reserve tariff charged at the scoring tokens, or null without a reserve. */
  readonly reserve: number | null
  /** The class fails the request's quality or capability needs (a session-locked quote skips this). */
  readonly unmet: ExclusionReason | undefined
  /** The quality scored: the catalog's, moved by the request's task ratings (D232). */
  readonly quality: number
  readonly qualityPenalty: number
  readonly taskFit: TaskFitBreakdown | undefined
}
