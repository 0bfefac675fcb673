/** The records of the auction: what a request asks, what competes, how bids rank and what clears. */
import type { Tariff } from "../domain/Billing.ts"
import type { SignedQuote } from "../domain/Quote.ts"
import type { Capability } from "./Catalog.ts"
import type { LatencyEstimate, Maturity } from "./LatencyStats.ts"
import type { MechanismVersion, RoutingProfile } from "./Route.ts"
import type { TaskFit } from "./TaskFit.ts"

export interface LatencySlo {
  readonly deadlineMs: number
  readonly confidence: number
}

export interface SessionLock {
  readonly providerId: string
  readonly modelClass: string
  readonly tariff: Tariff
}

export interface AuctionRequest {
  /** A routing profile alias or a concrete model class id. */
  readonly requested: string
  readonly promptTokens: number
  readonly maxTokens: number
  readonly minQuality?: number | undefined
  readonly requiredCapabilities?: ReadonlyArray<Capability> | undefined
  readonly latencySlo?: LatencySlo | undefined
  readonly sessionLock?: SessionLock | undefined
  /** The request's task (`routing.task`) and its rating evidence: moves class quality in the score (D232). */
  readonly taskFit?: TaskFit | undefined
  readonly nowMs: number
}

export interface LiveQuote {
  readonly quote: SignedQuote
  /** Requests currently holding one of the quote's capacity slots. */
  readonly inFlight: number
  /**
   * The provider's number (`providerNumber(provider_id)`, ProviderNumbers.ts), which `QuoteBook.live`
   * hands: the auction keeps each provider's best bid in an array by it, and passes it to the latency
   * lookup. Without it on every quote the auction numbers the providers itself (D301, D304).
   */
  readonly provider?: number | undefined
}

/**
 * A provider's latency in a class. `provider`, when given, is the provider's number (`LiveQuote.provider`):
 * the router's statistics then find the provider by index instead of by id (D304).
 */
export type LatencyLookup = (providerId: string, classId: string, provider?: number) => LatencyEstimate

export type ExclusionReason =
  | "unknown_class"
  | "below_min_quality"
  | "missing_capability"
  | "expired"
  | "at_capacity"
  | "context_too_small"
  | "above_reserve"
  | "latency_slo"
  | "below_quality_tier"
  | "class_not_selected"
  | "provider_better_quote"

export interface Exclusion {
  readonly quote_id: string
  readonly reason: ExclusionReason
}

/** How a request's task moved a class's quality (present when the request named a task). */
export interface TaskFitBreakdown {
  readonly task: string
  /** Ratings of the class for the task, and their mean (1..5; null with none). */
  readonly ratings: number
  readonly mean: number | null
  /** The catalog's quality of the class; `quality` in the breakdown is this plus `quality_shift`. */
  readonly catalog_quality: number
  readonly quality_shift: number
}

export interface ScoreBreakdown {
  /** The quote's own charge at the scoring tokens, base units. */
  readonly cost: number
  /** The quality scored: the class's, moved by the task's ratings when the request named a task. */
  readonly quality: number
  readonly quality_penalty: number
  readonly latency_ms: number
  readonly latency_quantile: number
  readonly latency_penalty: number
  readonly maturity: Maturity
  readonly multiplier_bps: number
  readonly task_fit?: TaskFitBreakdown
}

export interface RankedBid {
  readonly rank: number
  readonly quote_id: string
  readonly provider_id: string
  readonly model_class: string
  readonly price_in: number
  readonly price_out: number
  readonly price_in_cached?: number
  /** cost x multiplier: lower wins. */
  readonly score: number
  readonly score_breakdown: ScoreBreakdown
  readonly outcome: "won" | "lost"
}

export type PriceSetter = "runner-up" | "phantom-reserve" | "own-bid" | "session-lock"

export interface ClearingTariff {
  readonly price_in: number
  readonly price_out: number
  readonly price_in_cached?: number
}

export interface ScoringTokens {
  readonly promptTokens: number
  readonly maxTokens: number
}

export interface AuctionCleared {
  readonly _tag: "Cleared"
  readonly version: MechanismVersion
  readonly mechanism: "second-score"
  readonly profile: RoutingProfile
  /** Quotes that competed (ranked in `bids`). */
  readonly eligible: number
  /** Quotes in the request's scope before filtering. */
  readonly considered: number
  readonly excluded: ReadonlyArray<Exclusion>
  readonly bids: ReadonlyArray<RankedBid>
  readonly winner: RankedBid
  readonly winningQuote: SignedQuote
  readonly clear: ClearingTariff
  readonly priceSetter: PriceSetter
  /** The winner's own charge at the scoring tokens. */
  readonly ownCost: number
  /** charge(scoringTokens, clear): the worst case the caller authorizes. */
  readonly clearedCost: number
  /** The winner class's reserve tariff charged at the scoring tokens, or null without a reserve. */
  readonly reserveCost: number | null
  /** clearedCost - ownCost (negative only under a session lock whose tariff is below today's ask). */
  readonly premium: number
  readonly premiumCapBps: number
  readonly scoringTokens: ScoringTokens
}

export type NoEligibleReason =
  | "unknown_model_class"
  | "session_lock_unavailable"
  | "no_quotes"
  | "requirements_unmet"
  | "latency_slo_infeasible"
  | "no_eligible_quote"

export interface NoEligibleQuote {
  readonly _tag: "NoEligibleQuote"
  readonly reason: NoEligibleReason
  readonly version: MechanismVersion
  readonly profile: RoutingProfile
  readonly considered: number
  readonly excluded: ReadonlyArray<Exclusion>
}

export type AuctionOutcome = AuctionCleared | NoEligibleQuote
