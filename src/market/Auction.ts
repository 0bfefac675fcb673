/**
 * The second-score auction (docs/auction.md). Pure: the request's needs, the live quotes, the catalog and a
 * latency lookup in; eligible set, ranked bids, winner, clearing tariff and price setter out.
 */
import { charge, chargeNumerator, type Tariff, type TokenCounts, worstCase } from "../domain/Billing.ts"
import type { SignedQuote } from "../domain/Quote.ts"
import { type Capability, type Catalog, findClass, type ModelClass, missingCapabilities } from "./Catalog.ts"
import type { LatencyEstimate, Maturity } from "./LatencyStats.ts"

export type RoutingProfile = "auto" | "best" | "cheapest" | "fastest"
export const ROUTING_PROFILES: ReadonlyArray<RoutingProfile> = ["auto", "best", "cheapest", "fastest"]
export const isRoutingProfile = (value: string): value is RoutingProfile =>
  (ROUTING_PROFILES as ReadonlyArray<string>).includes(value)

export const MECHANISM_VERSION = "second-score/1"
export const DEADLINE_MECHANISM_VERSION = "deadline-price/1"
export type MechanismVersion = typeof MECHANISM_VERSION | typeof DEADLINE_MECHANISM_VERSION

/** Upper bound on promptTokens and maxTokens; the exact clearing construction relies on maxTokens <= 1e6. */
export const MAX_SCORING_TOKENS = 1_000_000
/** The TTFT quantile used in scores (an SLO uses its own confidence). */
export const SCORING_LATENCY_QUANTILE = 0.9
/** Latency penalty is 0 at or below the floor and 1 at or above the ceiling, logarithmic between. */
export const LATENCY_FLOOR_MS = 200
export const LATENCY_CEILING_MS = 10_000

export interface ProfileWeights {
  /** Score multipliers lie in [10000, premiumCapBps] bps, which bounds what the profile pays over the cheapest. */
  readonly premiumCapBps: number
  readonly qualityWeight: number
  readonly latencyWeight: number
  /** `best` only: candidates are the classes within this much quality of the best eligible class. */
  readonly qualityBand?: number
}

export const PROFILES: Readonly<Record<RoutingProfile, ProfileWeights>> = {
  cheapest: { premiumCapBps: 10_000, qualityWeight: 0, latencyWeight: 0 },
  auto: { premiumCapBps: 11_500, qualityWeight: 0.5, latencyWeight: 0.5 },
  best: { premiumCapBps: 13_000, qualityWeight: 0.6, latencyWeight: 0.4, qualityBand: 0.05 },
  fastest: { premiumCapBps: 12_500, qualityWeight: 0.1, latencyWeight: 0.9 }
}

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
  readonly nowMs: number
}

export interface LiveQuote {
  readonly quote: SignedQuote
  /** Requests currently holding one of the quote's capacity slots. */
  readonly inFlight: number
}

export type LatencyLookup = (providerId: string, classId: string) => LatencyEstimate

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

export interface ScoreBreakdown {
  /** The quote's own charge at the scoring tokens, base units. */
  readonly cost: number
  readonly quality: number
  readonly quality_penalty: number
  readonly latency_ms: number
  readonly latency_quantile: number
  readonly latency_penalty: number
  readonly maturity: Maturity
  readonly multiplier_bps: number
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

interface Route {
  readonly profile: RoutingProfile
  readonly version: MechanismVersion
  /** A pinned class id, or undefined for an alias over the whole market. */
  readonly pinnedClass: string | undefined
}

interface Candidate {
  readonly quote: SignedQuote
  readonly modelClass: ModelClass
  readonly cost: number
  readonly score: bigint
  readonly breakdown: ScoreBreakdown
}

const assertScoringTokens = (tokens: ScoringTokens): void => {
  for (const [name, value] of Object.entries(tokens)) {
    if (!Number.isSafeInteger(value) || value < 1 || value > MAX_SCORING_TOKENS) {
      throw new RangeError(`${name} must be an integer in [1, ${MAX_SCORING_TOKENS}], got ${value}`)
    }
  }
}

const resolveRoute = (request: AuctionRequest): Route => {
  const alias = isRoutingProfile(request.requested) ? request.requested : undefined
  const pinnedClass = request.sessionLock?.modelClass ?? (alias === undefined ? request.requested : undefined)
  const deadline =
    request.latencySlo !== undefined &&
    request.sessionLock === undefined &&
    (alias === "auto" || alias === undefined)
  if (deadline) return { profile: "cheapest", version: DEADLINE_MECHANISM_VERSION, pinnedClass }
  const profile = request.sessionLock !== undefined || alias === undefined ? "auto" : alias
  return { profile, version: MECHANISM_VERSION, pinnedClass }
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

const scoreCandidate = (
  quote: SignedQuote,
  modelClass: ModelClass,
  cost: number,
  weights: ProfileWeights,
  latency: LatencyEstimate
): Candidate => {
  const latencyMs = Math.round(latency.quantile(SCORING_LATENCY_QUANTILE))
  const breakdown = {
    cost,
    quality: modelClass.quality,
    quality_penalty: qualityPenalty(modelClass.quality),
    latency_ms: latencyMs,
    latency_quantile: SCORING_LATENCY_QUANTILE,
    latency_penalty: latencyPenalty(latencyMs),
    maturity: latency.maturity
  }
  const multiplier = multiplierBps(weights, breakdown.quality_penalty, breakdown.latency_penalty)
  return {
    quote,
    modelClass,
    cost,
    score: BigInt(cost) * BigInt(multiplier),
    breakdown: { ...breakdown, multiplier_bps: multiplier }
  }
}

const compareStrings = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** Total order: score, then own cost, then quote id, then provider id. */
const compareCandidates = (a: Candidate, b: Candidate): number =>
  (a.score < b.score ? -1 : a.score > b.score ? 1 : 0) ||
  a.cost - b.cost ||
  compareStrings(a.quote.quote_id, b.quote.quote_id) ||
  compareStrings(a.quote.provider_id, b.quote.provider_id)

const reserveCostOf = (modelClass: ModelClass, tokens: ScoringTokens): number | null =>
  modelClass.reserve === undefined
    ? null
    : worstCase(tokens.promptTokens, tokens.maxTokens, modelClass.reserve)

/** Why a quote cannot compete, or undefined. A session-locked quote skips the market-level filters. */
const exclusionReason = (
  live: LiveQuote,
  modelClass: ModelClass,
  request: AuctionRequest,
  cost: number,
  latency: LatencyEstimate,
  locked: boolean
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
  const reserve = reserveCostOf(modelClass, request)
  if (reserve !== null && cost > reserve) return "above_reserve"
  const slo = request.latencySlo
  if (slo !== undefined && !(latency.quantile(slo.confidence) <= slo.deadlineMs)) return "latency_slo"
  return undefined
}

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
  const top = Math.max(...candidates.map((c) => c.modelClass.quality))
  return { keep: (c) => c.modelClass.quality >= top - band - 1e-9, reason: "below_quality_tier" }
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

/** The highest own cost at which the winner's score would not exceed the runner-up's. */
export const criticalCost = (winnerMultiplierBps: number, runnerUpScore: bigint): number =>
  Number(runnerUpScore / BigInt(winnerMultiplierBps))

/** Second-score clearing: the runner-up's critical cost, capped by the phantom reserve, never below own ask. */
export const clearingPrice = (
  ownCost: number,
  critical: number | undefined,
  reserveCost: number | null
): { target: number; priceSetter: PriceSetter } => {
  if (critical === undefined) {
    return reserveCost === null
      ? { target: ownCost, priceSetter: "own-bid" }
      : { target: Math.max(ownCost, reserveCost), priceSetter: "phantom-reserve" }
  }
  if (reserveCost !== null && reserveCost < critical) {
    return { target: Math.max(ownCost, reserveCost), priceSetter: "phantom-reserve" }
  }
  return { target: Math.max(ownCost, critical), priceSetter: "runner-up" }
}

const toSafe = (value: bigint): number => {
  if (value > BigInt(Number.MAX_SAFE_INTEGER))
    throw new RangeError("clearing price exceeds the safe integer range")
  return Number(value)
}

/**
 * An integer tariff, component-wise at or above `own`, whose charge at the scoring tokens is exactly
 * `target`: scale both prices by target*1e6/W (floored, so the numerator stays <= target*1e6), then raise
 * price_out by floor(gap / maxTokens), which leaves the numerator in (target*1e6 - maxTokens, target*1e6],
 * inside the rounding bucket of `target` because maxTokens <= 1e6. Proof in docs/auction.md.
 */
export const clearingTariff = (own: Tariff, tokens: ScoringTokens, target: number): ClearingTariff => {
  assertScoringTokens(tokens)
  const cached =
    own.price_in_cached === undefined || own.price_in_cached === null
      ? {}
      : { price_in_cached: own.price_in_cached }
  const scoring: TokenCounts = { input: tokens.promptTokens, cachedInput: 0, output: tokens.maxTokens }
  const ownNumerator = chargeNumerator(scoring, own)
  const ownCost = charge(scoring, own)
  if (!Number.isSafeInteger(target) || target < ownCost) {
    throw new RangeError(`clearing target ${target} is below the own cost ${ownCost}`)
  }
  if (target === ownCost) return { price_in: own.price_in, price_out: own.price_out, ...cached }
  const top = BigInt(target) * 1_000_000n
  const scale = (price: number): bigint =>
    ownNumerator === 0n ? BigInt(price) : (BigInt(price) * top) / ownNumerator
  const priceIn = scale(own.price_in)
  const scaledOut = scale(own.price_out)
  const gap = top - (BigInt(tokens.promptTokens) * priceIn + BigInt(tokens.maxTokens) * scaledOut)
  const priceOut = scaledOut + gap / BigInt(tokens.maxTokens)
  return { price_in: toSafe(priceIn), price_out: toSafe(priceOut), ...cached }
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

const byQuoteId = (a: Exclusion, b: Exclusion): number =>
  compareStrings(a.quote_id, b.quote_id) || compareStrings(a.reason, b.reason)

const REQUIREMENT_REASONS: ReadonlyArray<ExclusionReason> = [
  "unknown_class",
  "below_min_quality",
  "missing_capability",
  "context_too_small"
]

const noEligibleReason = (considered: number, excluded: ReadonlyArray<Exclusion>): NoEligibleReason => {
  if (considered === 0) return "no_quotes"
  if (excluded.some((e) => e.reason === "latency_slo")) return "latency_slo_infeasible"
  if (excluded.every((e) => REQUIREMENT_REASONS.includes(e.reason))) return "requirements_unmet"
  return "no_eligible_quote"
}

const isLockedQuote = (quote: SignedQuote, lock: SessionLock | undefined): boolean =>
  lock !== undefined && quote.provider_id === lock.providerId && quote.model_class === lock.modelClass

/** Runs one auction. Never throws for market conditions; throws RangeError only for invalid token counts. */
export const runAuction = (
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
  for (const live of inScope) {
    const { quote } = live
    const modelClass = findClass(catalog, quote.model_class)
    if (modelClass === undefined) {
      excluded.push({ quote_id: quote.quote_id, reason: "unknown_class" })
      continue
    }
    const cost = worstCase(tokens.promptTokens, tokens.maxTokens, quote)
    const estimate = latency(quote.provider_id, quote.model_class)
    const reason = exclusionReason(live, modelClass, request, cost, estimate, isLockedQuote(quote, lock))
    if (reason !== undefined) excluded.push({ quote_id: quote.quote_id, reason })
    else candidates.push(scoreCandidate(quote, modelClass, cost, weights, estimate))
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
      : settle(winner, ranked.at(1), reserveCost, tokens)
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

const lockedClear = (tariff: Tariff): ClearingTariff => ({
  price_in: tariff.price_in,
  price_out: tariff.price_out,
  ...(tariff.price_in_cached === undefined || tariff.price_in_cached === null
    ? {}
    : { price_in_cached: tariff.price_in_cached })
})

const settle = (
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

export interface RivalCounterfactual {
  /** `rival-<n>` in ascending order of counterfactual charge. */
  readonly label: string
  readonly rank: number
  readonly model_class: string
  readonly price_in: number
  readonly price_out: number
  readonly price_in_cached?: number
  /** What this rival's signed tariff would have charged for the same tokens (Billing.charge). */
  readonly charge: number
}

/** Each losing bid's charge for the metered tokens, ascending, labelled rival-1..n. */
export const rivalCounterfactuals = (
  bids: ReadonlyArray<RankedBid>,
  tokens: TokenCounts
): ReadonlyArray<RivalCounterfactual> =>
  bids
    .filter((b) => b.outcome === "lost")
    .map((b) => ({
      rank: b.rank,
      model_class: b.model_class,
      price_in: b.price_in,
      price_out: b.price_out,
      ...(b.price_in_cached === undefined ? {} : { price_in_cached: b.price_in_cached }),
      charge: charge(tokens, b)
    }))
    .sort((a, b) => a.charge - b.charge || a.rank - b.rank)
    .map((r, i) => ({ label: `rival-${i + 1}`, ...r }))

/** The positional label of a losing bid: rank 2 is rival-1. */
export const rivalLabel = (rank: number): string => `rival-${rank - 1}`

/**
 * The public view: losing providers (and their quote ids) become `rival-<n>` by rank, with their exact
 * signed tariffs kept; excluded quote ids are dropped to their reasons. The winner stays named.
 */
export const anonymizeBids = <A extends AuctionOutcome>(auction: A): A => {
  const excluded = auction.excluded.map((e, i) => ({ quote_id: `excluded-${i + 1}`, reason: e.reason }))
  if (auction._tag === "NoEligibleQuote") return { ...auction, excluded }
  const bids = auction.bids.map((b) =>
    b.outcome === "won" ? b : { ...b, provider_id: rivalLabel(b.rank), quote_id: rivalLabel(b.rank) }
  )
  return { ...auction, excluded, bids }
}
