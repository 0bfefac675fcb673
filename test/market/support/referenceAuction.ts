/**
 * The auction as it was before its per-quote work became flat arrays (D280, D281): candidates as objects,
 * a full sort of them, exclusions sorted by quote id. Kept in test only, as the reference the
 * optimized `runAuction` must match outcome for outcome (test/market/auction.test.ts, "the optimized auction").
 */

import { worstCase } from "../../../src/domain/Billing.ts"
import type { SignedQuote } from "../../../src/domain/Quote.ts"
import {
  type AuctionOutcome,
  type AuctionRequest,
  assertScoringTokens,
  type ClearingTariff,
  clearingPrice,
  clearingTariff,
  criticalCost,
  type Exclusion,
  type ExclusionReason,
  type LatencyLookup,
  type LiveQuote,
  type NoEligibleReason,
  PROFILES,
  type PriceSetter,
  type ProfileWeights,
  type RankedBid,
  type ScoreBreakdown,
  type ScoringTokens
} from "../../../src/market/Auction.ts"
import { type Catalog, findClass, type ModelClass, missingCapabilities } from "../../../src/market/Catalog.ts"
import { lockedClear } from "../../../src/market/Clear.ts"
import { byQuoteId, isLockedQuote, noEligibleReason, reserveCostOf } from "../../../src/market/Eligibility.ts"
import type { LatencyEstimate } from "../../../src/market/LatencyStats.ts"
import { DEADLINE_MECHANISM_VERSION, type Route, resolveRoute } from "../../../src/market/Route.ts"
import { qualityShift, type TaskFit } from "../../../src/market/TaskFit.ts"

const SCORING_LATENCY_QUANTILE = 0.9
const LATENCY_FLOOR_MS = 200
const LATENCY_CEILING_MS = 10_000
interface Candidate {
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
const latencyPenalty = (latencyMs: number): number =>
  Number.isFinite(latencyMs)
    ? roundPenalty(Math.log(latencyMs / LATENCY_FLOOR_MS) / Math.log(LATENCY_CEILING_MS / LATENCY_FLOOR_MS))
    : 1

const qualityPenalty = (quality: number): number => roundPenalty(1 - quality)

/** The profile's score multiplier in basis points, always within [10000, premiumCapBps]. */
const multiplierBps = (weights: ProfileWeights, qualityPenaltyValue: number, latencyPenaltyValue: number) => {
  const penalty = weights.qualityWeight * qualityPenaltyValue + weights.latencyWeight * latencyPenaltyValue
  return 10_000 + Math.round((weights.premiumCapBps - 10_000) * Math.min(1, Math.max(0, penalty)))
}

const scoreCandidate = (
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

const compareStrings = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** Total order: score, then own cost, then quote id, then provider id. */
const compareCandidates = (a: Candidate, b: Candidate): number =>
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

const restrictToProfile = (
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
const rankIndependentBids = (
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

const toBid = (c: Candidate, index: number): RankedBid => ({
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
/** Why a quote cannot compete, or undefined. A session-locked quote skips the market-level filters. */
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
const clearWinner = (
  winner: Candidate,
  runnerUp: Candidate | undefined,
  reserveCost: number | null,
  tokens: ScoringTokens
): { clear: ClearingTariff; priceSetter: PriceSetter } => {
  const critical =
    runnerUp === undefined ? undefined : criticalCost(winner.breakdown.multiplier_bps, runnerUp.score)
  const { target, priceSetter } = clearingPrice(winner.cost, critical, reserveCost)
  return { clear: clearingTariff(winner.quote, tokens, target), priceSetter }
}

export const referenceAuction = (
  request: AuctionRequest,
  quotes: ReadonlyArray<LiveQuote>,
  catalog: Catalog,
  latency: LatencyLookup
): AuctionOutcome => {
  const tokens: ScoringTokens = { promptTokens: request.promptTokens, maxTokens: request.maxTokens }
  assertScoringTokens(tokens)
  const route = resolveRoute(request)
  const weights = PROFILES[route.profile]
  const lock = request.sessionLock
  const noEligible = (reason: NoEligibleReason, considered: number, excluded: ReadonlyArray<Exclusion>) =>
    ({
      _tag: "NoEligibleQuote",
      reason,
      version: route.version,
      profile: route.profile,
      considered,
      excluded
    }) as const
  if (route.pinnedClass !== undefined && findClass(catalog, route.pinnedClass) === undefined) {
    return noEligible("unknown_model_class", 0, [])
  }

  const inScope = quotes.filter(
    (l) => route.pinnedClass === undefined || l.quote.model_class === route.pinnedClass
  )
  const excluded: Array<Exclusion> = []
  const candidates: Array<Candidate> = []
  // Per class, once: a class's reserve cost is the same for every quote of it.
  const reserves = new Map<string, number | null>()
  for (const live of inScope) {
    const { quote } = live
    const modelClass = findClass(catalog, quote.model_class)
    if (modelClass === undefined) {
      excluded.push({ quote_id: quote.quote_id, reason: "unknown_class" })
      continue
    }
    const cost = worstCase(tokens.promptTokens, tokens.maxTokens, quote)
    const estimate = latency(quote.provider_id, quote.model_class)
    let reserve = reserves.get(modelClass.id)
    if (reserve === undefined) {
      reserve = reserveCostOf(modelClass, tokens)
      reserves.set(modelClass.id, reserve)
    }
    const locked = isLockedQuote(quote, lock)
    const reason = exclusionReason(live, modelClass, request, cost, estimate, locked, reserve)
    if (reason !== undefined) excluded.push({ quote_id: quote.quote_id, reason })
    else candidates.push(scoreCandidate(quote, modelClass, cost, weights, estimate, request.taskFit))
  }

  const lockedWinner =
    lock === undefined
      ? undefined
      : candidates
          .filter((c) => isLockedQuote(c.quote, lock))
          .sort((a, b) => a.cost - b.cost || compareCandidates(a, b))[0]
  if (lock !== undefined && lockedWinner === undefined) {
    return noEligible("session_lock_unavailable", inScope.length, [...excluded].sort(byQuoteId))
  }
  const restricted =
    lock === undefined ? restrictToProfile(candidates, route) : { kept: candidates, dropped: [] }
  const { ranked, dropped } = rankIndependentBids(restricted.kept, lockedWinner)
  const allExcluded = [...excluded, ...restricted.dropped, ...dropped].sort(byQuoteId)
  const winner = ranked.at(0)
  if (winner === undefined) {
    return noEligible(noEligibleReason(inScope.length, allExcluded), inScope.length, allExcluded)
  }

  const reserveCost = reserveCostOf(winner.modelClass, tokens)
  const { clear, priceSetter } =
    lock !== undefined
      ? { clear: lockedClear(lock.tariff), priceSetter: "session-lock" as const }
      : clearWinner(winner, ranked.at(1), reserveCost, tokens)
  const clearedCost = worstCase(tokens.promptTokens, tokens.maxTokens, clear)
  const bids = ranked.map(toBid)
  const winnerBid = toBid(winner, 0)
  return {
    _tag: "Cleared",
    version: route.version,
    mechanism: "second-score",
    profile: route.profile,
    eligible: ranked.length,
    considered: inScope.length,
    excluded: allExcluded,
    bids,
    winner: winnerBid,
    winningQuote: winner.quote,
    clear,
    priceSetter,
    ownCost: winner.cost,
    clearedCost,
    reserveCost,
    premium: clearedCost - winner.cost,
    premiumCapBps: weights.premiumCapBps,
    scoringTokens: tokens
  }
}
