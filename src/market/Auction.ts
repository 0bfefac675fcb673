/**
 * The second-score auction (docs/auction.md). Pure: the request's needs, the live quotes, the catalog and a
 * latency lookup in; eligible set, ranked bids, winner, clearing tariff and price setter out. Its steps
 * have a file each: `Route.ts` (alias or class), `Eligibility.ts` (which quotes may compete), `Award.ts`
 * (scores and ranks), `Clear.ts` (the price); `Rfq.ts` feeds it the live book.
 */
import { charge, type TokenCounts, worstCase } from "../domain/Billing.ts"
import type { RivalCounterfactual } from "../domain/Economics.ts"
import type {
  AuctionOutcome,
  AuctionRequest,
  Exclusion,
  LatencyLookup,
  LiveQuote,
  NoEligibleReason,
  RankedBid,
  ScoringTokens
} from "./AuctionRecords.ts"
import {
  type Candidate,
  compareCandidates,
  rankIndependentBids,
  restrictToProfile,
  scoreCandidate,
  toBid
} from "./Award.ts"
import { type Catalog, findClass } from "./Catalog.ts"
import { assertScoringTokens, clearWinner, lockedClear } from "./Clear.ts"
import { byQuoteId, exclusionReason, isLockedQuote, noEligibleReason, reserveCostOf } from "./Eligibility.ts"
import { PROFILES, resolveRoute } from "./Route.ts"

export type {
  AuctionCleared,
  AuctionOutcome,
  AuctionRequest,
  ClearingTariff,
  Exclusion,
  ExclusionReason,
  LatencyLookup,
  LatencySlo,
  LiveQuote,
  NoEligibleQuote,
  NoEligibleReason,
  PriceSetter,
  RankedBid,
  ScoreBreakdown,
  ScoringTokens,
  SessionLock
} from "./AuctionRecords.ts"
export { latencyPenalty, multiplierBps, qualityPenalty, SCORING_LATENCY_QUANTILE } from "./Award.ts"
export {
  assertScoringTokens,
  clearingPrice,
  clearingTariff,
  criticalCost,
  MAX_SCORING_TOKENS
} from "./Clear.ts"
export {
  DEADLINE_MECHANISM_VERSION,
  isRoutingProfile,
  MECHANISM_VERSION,
  type MechanismVersion,
  PROFILES,
  type ProfileWeights,
  ROUTING_PROFILES,
  type RoutingProfile
} from "./Route.ts"
export type { RivalCounterfactual }

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
