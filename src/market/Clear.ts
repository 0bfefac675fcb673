/**
 * The clear step (pure): the winner pays the second score, the highest own cost at which it would
 * still have beaten the runner-up, capped by its class's phantom reserve and never below its own ask,
 * as an integer tariff whose charge at the scoring tokens is exactly that price (docs/auction.md).
 * A session turn clears at the session's locked tariff.
 */
import { charge, chargeNumerator, type Tariff, type TokenCounts } from "../domain/Billing.ts"
import type { ClearingTariff, PriceSetter, ScoringTokens } from "./AuctionRecords.ts"
import type { Candidates } from "./Candidates.ts"

/** Upper bound on promptTokens and maxTokens; the exact clearing construction relies on maxTokens <= 1e6. */
export const MAX_SCORING_TOKENS = 1_000_000

export const assertScoringTokens = (tokens: ScoringTokens): void => {
  for (const [name, value] of Object.entries(tokens)) {
    if (!Number.isSafeInteger(value) || value < 1 || value > MAX_SCORING_TOKENS) {
      throw new RangeError(`${name} must be an integer in [1, ${MAX_SCORING_TOKENS}], got ${value}`)
    }
  }
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

const MAX_PRICE = BigInt(Number.MAX_SAFE_INTEGER)

/**
 * An integer tariff, component-wise at or above `own`, whose charge at the scoring tokens is exactly
 * `target`: scale both prices by target*1e6/W (floored, so the numerator stays <= target*1e6), then raise
 * price_out by floor(gap / maxTokens), which leaves the numerator in (target*1e6 - maxTokens, target*1e6],
 * inside the rounding bucket of `target` because maxTokens <= 1e6. Proof in docs/auction.md.
 *
 * Where a scaled price would pass 2^53 (a tiny own cost cleared at a huge target), the gap goes onto the
 * component with more tokens first, then the rest onto the other, each at most 2^53 - 1: exact where the
 * capped components can carry it, else the highest charge they can, below `target` (D425). Never throws for a market's
 * prices: one absurd quote must not fail every auction of its class.
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
  if (priceIn <= MAX_PRICE && priceOut <= MAX_PRICE) {
    return { price_in: Number(priceIn), price_out: Number(priceOut), ...cached }
  }
  return { ...filledTariff(own, tokens, top - ownNumerator), ...cached }
}

/** `own` raised by `gap` of numerator: the component with more tokens first, each capped at 2^53 - 1. */
const filledTariff = (own: Tariff, tokens: ScoringTokens, gap: bigint) => {
  const prompt = BigInt(tokens.promptTokens)
  const output = BigInt(tokens.maxTokens)
  let left = gap
  const raise = (price: number, perUnit: bigint): number => {
    const added = left / perUnit < MAX_PRICE - BigInt(price) ? left / perUnit : MAX_PRICE - BigInt(price)
    left -= added * perUnit
    return Number(BigInt(price) + added)
  }
  if (output >= prompt) {
    const price_out = raise(own.price_out, output)
    return { price_in: raise(own.price_in, prompt), price_out }
  }
  const price_in = raise(own.price_in, prompt)
  return { price_in, price_out: raise(own.price_out, output) }
}

export const lockedClear = (tariff: Tariff): ClearingTariff => ({
  price_in: tariff.price_in,
  price_out: tariff.price_out,
  ...(tariff.price_in_cached === undefined || tariff.price_in_cached === null
    ? {}
    : { price_in_cached: tariff.price_in_cached })
})

/** Clears candidate `winner` against candidate `runnerUp` (-1 when it bid alone). */
export const clearWinner = (
  candidates: Candidates,
  winner: number,
  runnerUp: number,
  reserveCost: number | null,
  tokens: ScoringTokens
): { clear: ClearingTariff; priceSetter: PriceSetter } => {
  const critical =
    runnerUp < 0 ? undefined : criticalCost(candidates.multiplier[winner]!, candidates.exactScore(runnerUp))
  const { target, priceSetter } = clearingPrice(candidates.cost[winner]!, critical, reserveCost)
  return { clear: clearingTariff(candidates.quoteOf(winner), tokens, target), priceSetter }
}
