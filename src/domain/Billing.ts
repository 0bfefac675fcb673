/**
 * The one billing function. Every charge the service states (receipt, economics, rival counterfactuals,
 * worst-case authorization, key spend) is computed here, in integer base units.
 */

/** Token counts of one request. `cachedInput` is the part of `input` billed at the cached rate. */
export interface TokenCounts {
  readonly input: number
  readonly cachedInput: number
  readonly output: number
}

/** Prices in base units per 1,000,000 tokens. */
export interface Tariff {
  readonly price_in: number
  readonly price_out: number
  readonly price_in_cached?: number | null | undefined
}

/** The router fee: 7% of cleared volume, in basis points. */
export const ROUTER_FEE_BPS = 700

const TOKENS_PER_PRICE_UNIT = 1_000_000n
const BPS = 10_000n

const requireCount = (name: string, value: number): bigint => {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${name} must be a non-negative safe integer, got ${value}`)
  }
  return BigInt(value)
}

const toSafeNumber = (name: string, value: bigint): number => {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw new RangeError(`${name} exceeds the safe integer range`)
  return Number(value)
}

const ceilDiv = (numerator: bigint, denominator: bigint): bigint =>
  (numerator + denominator - 1n) / denominator

/**
 * The charge before division by one million: token counts times per-million prices, exact.
 * Exposed for the clearing construction, which must land a numerator in a given rounding bucket.
 */
export const chargeNumerator = (tokens: TokenCounts, tariff: Tariff): bigint => {
  const input = requireCount("input", tokens.input)
  const cachedInput = requireCount("cachedInput", tokens.cachedInput)
  const output = requireCount("output", tokens.output)
  if (cachedInput > input) throw new RangeError("cachedInput must not exceed input")
  const priceIn = requireCount("price_in", tariff.price_in)
  const priceOut = requireCount("price_out", tariff.price_out)
  const priceInCached =
    tariff.price_in_cached === undefined || tariff.price_in_cached === null
      ? priceIn
      : requireCount("price_in_cached", tariff.price_in_cached)
  return (input - cachedInput) * priceIn + cachedInput * priceInCached + output * priceOut
}

const PRICE_UNIT = 1_000_000

/**
 * The charge in plain numbers when every product and the sum stay below 2^53 (then each is exact in a
 * double, as is the quotient's remainder), else undefined. An auction prices every live quote, and the
 * bigint path costs several allocations a quote; the property test holds this equal to the bigint one.
 */
const chargeFast = (tokens: TokenCounts, tariff: Tariff): number | undefined => {
  const { input, cachedInput, output } = tokens
  const priceIn = tariff.price_in
  const priceOut = tariff.price_out
  const cached = tariff.price_in_cached ?? priceIn
  if (
    !(
      Number.isSafeInteger(input) &&
      Number.isSafeInteger(cachedInput) &&
      Number.isSafeInteger(output) &&
      Number.isSafeInteger(priceIn) &&
      Number.isSafeInteger(priceOut) &&
      Number.isSafeInteger(cached) &&
      cachedInput >= 0 &&
      cachedInput <= input &&
      output >= 0 &&
      priceIn >= 0 &&
      priceOut >= 0 &&
      cached >= 0
    )
  )
    return undefined
  const numerator = (input - cachedInput) * priceIn + cachedInput * cached + output * priceOut
  if (!(numerator <= Number.MAX_SAFE_INTEGER)) return undefined
  const whole = Math.floor(numerator / PRICE_UNIT)
  const rest = numerator - whole * PRICE_UNIT
  // The floored quotient may be one off where the double division rounded; the exact rest corrects it.
  const quotient = rest < 0 ? whole - 1 : rest >= PRICE_UNIT ? whole + 1 : whole
  return numerator - quotient * PRICE_UNIT > 0 ? quotient + 1 : quotient
}

/** Charge in base units: the exact cost rounded up to the next base unit. */
export const charge = (tokens: TokenCounts, tariff: Tariff): number =>
  chargeFast(tokens, tariff) ??
  toSafeNumber("charge", ceilDiv(chargeNumerator(tokens, tariff), TOKENS_PER_PRICE_UNIT))

/** The bigint path alone: the reference the fast path is tested against. */
export const chargeExact = (tokens: TokenCounts, tariff: Tariff): number =>
  toSafeNumber("charge", ceilDiv(chargeNumerator(tokens, tariff), TOKENS_PER_PRICE_UNIT))

/** The most a request can cost: the whole prompt at the input price and `maxTokens` of output. */
export const worstCase = (promptTokens: number, maxTokens: number, tariff: Tariff): number =>
  charge({ input: promptTokens, cachedInput: 0, output: maxTokens }, tariff)

/** The router's 7% of a cleared charge, rounded half-up; the provider's share is the exact remainder. */
export const feeSplit = (chargedAmount: number): { routerFee: number; providerShare: number } => {
  const amount = requireCount("charge", chargedAmount)
  const routerFee = (amount * BigInt(ROUTER_FEE_BPS) + BPS / 2n) / BPS
  return { routerFee: Number(routerFee), providerShare: Number(amount - routerFee) }
}
