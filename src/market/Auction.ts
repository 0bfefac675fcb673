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
  ExclusionReason,
  LatencyLookup,
  LiveQuote,
  NoEligibleReason,
  RankedBid,
  ScoringTokens
} from "./AuctionRecords.ts"
import { profileRestriction, rankIndependentBids } from "./Award.ts"
import { Candidates } from "./Candidates.ts"
import { type Catalog, findClass } from "./Catalog.ts"
import { assertScoringTokens, clearWinner, lockedClear } from "./Clear.ts"
import { byQuoteId, classTerms, exclusionReason, isLockedQuote, noEligibleReason } from "./Eligibility.ts"
import { DEADLINE_MECHANISM_VERSION, PROFILES, type Route, resolveRoute } from "./Route.ts"

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
export { latencyPenalty, multiplierBps, qualityPenalty, SCORING_LATENCY_QUANTILE } from "./Scoring.ts"
export type { RivalCounterfactual }

/** Per input quote: 0 out of scope, COMPETING, or why it does not compete (its index in REASONS, plus 2). */
const COMPETING = 1
const REASONS: ReadonlyArray<ExclusionReason> = [
  "unknown_class",
  "below_min_quality",
  "missing_capability",
  "expired",
  "at_capacity",
  "context_too_small",
  "above_reserve",
  "latency_slo",
  "below_quality_tier",
  "class_not_selected",
  "provider_better_quote"
]
const codeOf = (reason: ExclusionReason): number => REASONS.indexOf(reason) + 2

/**
 * The exclusions by quote id. The quote book hands its quotes in quote id order (`QuoteBook.live`), and
 * then they are listed as they come: each excluded id is checked to be above the one before (D303; then
 * no two share an id, so no tie by reason either); any other order is sorted.
 */
const exclusionsOf = (quotes: ReadonlyArray<LiveQuote>, codes: Uint8Array): Array<Exclusion> => {
  const excluded: Array<Exclusion> = []
  let inOrder = true
  let previousId: string | undefined
  for (let i = 0; i < quotes.length; i++) {
    const code = codes[i]!
    if (code <= COMPETING) continue
    const id = quotes[i]!.quote.quote_id
    if (inOrder && previousId !== undefined && !(previousId < id)) inOrder = false
    previousId = id
    excluded.push({ quote_id: id, reason: REASONS[code - 2]! })
  }
  return inOrder ? excluded : excluded.sort(byQuoteId)
}

const noEligibleOutcome = (
  route: Route,
  reason: NoEligibleReason,
  considered: number,
  excluded: ReadonlyArray<Exclusion>
) =>
  ({
    _tag: "NoEligibleQuote",
    reason,
    version: route.version,
    profile: route.profile,
    considered,
    excluded
  }) as const

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
  const pinned = route.pinnedClass
  if (pinned !== undefined && findClass(catalog, pinned) === undefined) {
    return noEligibleOutcome(route, "unknown_model_class", 0, [])
  }
  const candidates = Candidates.take(quotes)
  const considered = admit(request, route, catalog, latency, candidates)
  const outcome = decide(request, route, tokens, candidates, considered)
  candidates.release()
  return outcome
}

/**
 * The one pass over the book: each in-scope quote's code (competing, or why not), and the competing
 * ones scored into `candidates`. Returns how many quotes were in scope (of the pinned class, if one is).
 */
const admit = (
  request: AuctionRequest,
  route: Route,
  catalog: Catalog,
  latency: LatencyLookup,
  candidates: Candidates
): number => {
  const quotes = candidates.input
  const { codes } = candidates
  const weights = PROFILES[route.profile]
  const lock = request.sessionLock
  const pinned = route.pinnedClass
  const terms = classTerms(catalog, request)
  const slo = request.latencySlo
  let considered = 0
  for (let i = 0; i < quotes.length; i++) {
    const live = quotes[i]!
    const { quote } = live
    if (pinned !== undefined && quote.model_class !== pinned) continue
    considered++
    const classTerms = terms.get(quote.model_class)
    if (classTerms === undefined) {
      codes[i] = codeOf("unknown_class")
      continue
    }
    const cost = worstCase(request.promptTokens, request.maxTokens, quote)
    const locked = isLockedQuote(quote, lock)
    const reason = exclusionReason(live, classTerms, request, cost, locked)
    if (reason !== undefined) {
      codes[i] = codeOf(reason)
      continue
    }
    const estimate = latency(quote.provider_id, quote.model_class, live.provider)
    if (!locked && slo !== undefined && !(estimate.quantile(slo.confidence) <= slo.deadlineMs)) {
      codes[i] = codeOf("latency_slo")
      continue
    }
    codes[i] = COMPETING
    candidates.add(i, classTerms, cost, estimate, locked, weights)
  }
  return considered
}

/** The session's provider wins with its cheapest usable quote (ties in the total order), or -1. */
const lockedWinnerOf = (candidates: Candidates): number => {
  let lockedWinner = -1
  for (let c = 0; c < candidates.n; c++) {
    if (!candidates.locked[c]) continue
    if (
      lockedWinner < 0 ||
      candidates.cost[c]! - candidates.cost[lockedWinner]! < 0 ||
      (candidates.cost[c] === candidates.cost[lockedWinner] && candidates.compare(c, lockedWinner) < 0)
    )
      lockedWinner = c
  }
  return lockedWinner
}

/** After admission: the session lock, the profile's restriction, one bid per provider, the clear. */
const decide = (
  request: AuctionRequest,
  route: Route,
  tokens: ScoringTokens,
  candidates: Candidates,
  considered: number
): AuctionOutcome => {
  const quotes = candidates.input
  const { codes } = candidates
  const lock = request.sessionLock
  const lockedWinner = lock === undefined ? -1 : lockedWinnerOf(candidates)
  if (lock !== undefined && lockedWinner < 0) {
    return noEligibleOutcome(route, "session_lock_unavailable", considered, exclusionsOf(quotes, codes))
  }
  const restriction =
    lock === undefined
      ? profileRestriction(
          candidates,
          route.version === DEADLINE_MECHANISM_VERSION,
          PROFILES[route.profile].qualityBand
        )
      : undefined
  if (restriction !== undefined) {
    const code = codeOf(restriction.reason)
    for (let c = 0; c < candidates.n; c++) if (!restriction.keep(c)) codes[candidates.position[c]!] = code
  }
  const competing = (c: number) => codes[candidates.position[c]!] === COMPETING
  const betterQuote = codeOf("provider_better_quote")
  const ranked = rankIndependentBids(candidates, competing, lockedWinner, (c) => {
    codes[candidates.position[c]!] = betterQuote
  })
  const excluded = exclusionsOf(quotes, codes)
  if (ranked.length === 0) {
    return noEligibleOutcome(route, noEligibleReason(considered, excluded), considered, excluded)
  }

  const winner = ranked[0]!
  const reserveCost = candidates.termsOf(winner).reserve
  const { clear, priceSetter } =
    lock !== undefined
      ? { clear: lockedClear(lock.tariff), priceSetter: "session-lock" as const }
      : clearWinner(candidates, winner, ranked.length > 1 ? ranked[1]! : -1, reserveCost, tokens)
  const clearedCost = worstCase(tokens.promptTokens, tokens.maxTokens, clear)
  const bids: Array<RankedBid> = []
  for (let k = 0; k < ranked.length; k++) bids.push(candidates.toBid(ranked[k]!, k))
  const ownCost = candidates.cost[winner]!
  return {
    _tag: "Cleared",
    version: route.version,
    mechanism: "second-score",
    profile: route.profile,
    eligible: ranked.length,
    considered,
    excluded,
    bids,
    winner: bids[0]!,
    winningQuote: candidates.quoteOf(winner),
    clear,
    priceSetter,
    ownCost,
    clearedCost,
    reserveCost,
    premium: clearedCost - ownCost,
    premiumCapBps: PROFILES[route.profile].premiumCapBps,
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
