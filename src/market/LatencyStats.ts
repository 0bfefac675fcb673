/**
 * Decayed empirical time-to-first-token distribution for one (provider, model class).
 *
 * A fixed log-spaced histogram (bounded memory: BUCKET_COUNT numbers whatever the traffic) whose weights
 * halve every `halfLifeMs`, so recent measurements dominate. Pure and immutable: time is an input.
 *
 * Immature data rule: until the effective (decayed) sample weight reaches `matureWeight`, a quantile is
 * blended with a conservative prior: with observed share a = min(1, weight / matureWeight),
 *   quantile = max(observed, (1 - a) * priorMs + a * observed).
 * A cold provider therefore reports the prior (2000 ms by default): it can win when no latency SLO is
 * asked, but passes a tight SLO only once it has been measured. Observations slower than the prior are
 * never blended down. When traffic stops, weight decays and the estimate drifts back towards the prior.
 */

export type Maturity = "cold" | "warming" | "mature"

export interface LatencyConfig {
  /** Weights halve after this long. */
  readonly halfLifeMs: number
  /** The conservative TTFT assumed without data. */
  readonly priorMs: number
  /** Effective weight at which the prior has faded out entirely: "mature". */
  readonly matureWeight: number
  /** Effective weight below which data is "cold". */
  readonly warmingWeight: number
}

export const defaultLatencyConfig: LatencyConfig = {
  halfLifeMs: 10 * 60_000,
  priorMs: 2_000,
  matureWeight: 20,
  warmingWeight: 3
}

/** What the auction needs to know about a provider's latency in a class. */
export interface LatencyEstimate {
  readonly quantile: (q: number) => number
  readonly maturity: Maturity
}

export interface LatencyState {
  /** Bucket weights as of `atMs`. */
  readonly weights: ReadonlyArray<number>
  readonly atMs: number
  /** The sum of `weights`, kept by `record` so an auction does not add 53 numbers per quote. */
  readonly total?: number
}

const FIRST_UPPER_MS = 10
const GROWTH = 1.2
/** Upper bounds 10 ms, 12 ms, ... up to about 130 s; slower samples land in the last bucket. */
export const BUCKET_COUNT = 53
/** Bucket i holds (UPPER[i - 1], UPPER[i]]: computed once (the quantile walk reads them per call). */
const UPPER: ReadonlyArray<number> = Array.from(
  { length: BUCKET_COUNT },
  (_, i) => FIRST_UPPER_MS * GROWTH ** i
)
const upperBound = (i: number): number => UPPER[i]!
const lowerBound = (i: number): number => (i === 0 ? 0 : UPPER[i - 1]!)

export const emptyLatencyState: LatencyState = {
  weights: Array.from({ length: BUCKET_COUNT }, () => 0),
  atMs: 0,
  total: 0
}

const bucketOf = (ttftMs: number): number => {
  if (ttftMs <= FIRST_UPPER_MS) return 0
  const i = Math.ceil(Math.log(ttftMs / FIRST_UPPER_MS) / Math.log(GROWTH) - 1e-9)
  return Math.min(BUCKET_COUNT - 1, Math.max(0, i))
}

const decayFactor = (fromMs: number, toMs: number, config: LatencyConfig): number =>
  toMs <= fromMs ? 1 : 2 ** (-(toMs - fromMs) / config.halfLifeMs)

const sumOf = (weights: ReadonlyArray<number>): number => {
  let sum = 0
  for (let i = 0; i < weights.length; i++) sum += weights[i]!
  return sum
}

const rawWeight = (state: LatencyState): number => state.total ?? sumOf(state.weights)

/** Adds one measurement at `nowMs`. A clock that steps backwards is treated as no time passing. */
export const record = (
  state: LatencyState,
  ttftMs: number,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): LatencyState => {
  if (!Number.isFinite(ttftMs) || ttftMs < 0)
    throw new RangeError(`ttftMs must be finite and >= 0, got ${ttftMs}`)
  const atMs = Math.max(state.atMs, nowMs)
  const factor = decayFactor(state.atMs, atMs, config)
  const target = bucketOf(ttftMs)
  const weights = state.weights.map((w, i) => w * factor + (i === target ? 1 : 0))
  return { weights, atMs, total: sumOf(weights) }
}

/** The decayed number of samples behind the estimate. */
export const effectiveWeight = (
  state: LatencyState,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): number => rawWeight(state) * decayFactor(state.atMs, nowMs, config)

export const maturity = (
  state: LatencyState,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): Maturity => {
  return maturityOf(effectiveWeight(state, nowMs, config), config)
}

/** The q-quantile of weights summing to `total` (linear inside a bucket); `total` must be above 0. */
const quantileOfWeights = (weights: ReadonlyArray<number>, total: number, q: number): number => {
  const target = Math.min(1, Math.max(0, q)) * total
  let below = 0
  for (let i = 0; i < BUCKET_COUNT; i++) {
    const w = weights[i] ?? 0
    if (w > 0 && below + w >= target) {
      const fraction = Math.min(1, Math.max(0, (target - below) / w))
      return lowerBound(i) + fraction * (upperBound(i) - lowerBound(i))
    }
    below += w
  }
  return upperBound(BUCKET_COUNT - 1)
}

/**
 * The q-quantile of the measurements alone (linear inside a bucket), or undefined without data.
 * Decay scales every bucket alike, so this does not depend on the current time.
 */
export const observedQuantile = (state: LatencyState, q: number): number | undefined => {
  const total = rawWeight(state)
  return total > 0 ? quantileOfWeights(state.weights, total, q) : undefined
}

/** The planned quantile from the observed one and the decayed weight: the prior blended by maturity. */
const blend = (observed: number | undefined, weight: number, config: LatencyConfig): number => {
  if (observed === undefined) return config.priorMs
  const share = Math.min(1, weight / config.matureWeight)
  return Math.max(observed, (1 - share) * config.priorMs + share * observed)
}

const maturityOf = (weight: number, config: LatencyConfig): Maturity =>
  weight >= config.matureWeight ? "mature" : weight >= config.warmingWeight ? "warming" : "cold"

/** The TTFT quantile the router plans with: observations blended with the prior by data maturity. */
export const quantile = (
  state: LatencyState,
  q: number,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): number => blend(observedQuantile(state, q), effectiveWeight(state, nowMs, config), config)

/**
 * A (provider, class) state with the observed quantiles last asked of it. A state never changes (`record`
 * makes a new one), so the remembered answers stay true from one auction to the next: an auction asks
 * the scoring quantile of every live quote, and with an SLO its confidence too, hence two slots.
 *
 * Most estimates in a busy market are mature, and a mature estimate is the observation itself whatever its
 * exact weight (the blend's share is 1); a never-measured pair is the prior, cold, at every time. So the
 * entry works out once, when made, until when its estimate does not depend on the time (`steadyUntilMs`:
 * for ever without data, else while its decayed weight is certainly at least `matureWeight`), and until
 * then hands one estimate object for every auction: no decay power, no object per lookup. The bound: 2^-x >= 1 - x ln 2, so
 * total x (1 - 0.7 dt / half-life) >= matureWeight x (1 + 1e-9) is enough (0.7 > ln 2 leaves 1% of the
 * weight above `matureWeight` for every rounding).
 */
export class LatencyEntry {
  readonly state: LatencyState
  readonly config: LatencyConfig
  /** The undecayed sample weight (`state.total`, or the bucket sum). */
  readonly total: number
  /** Up to this time the entry's estimate is `#steady` (-Infinity when it never is). */
  readonly steadyUntilMs: number
  readonly #steady: LatencyEstimate
  #lastQ = Number.NaN
  #last: number | undefined
  #otherQ = Number.NaN
  #other: number | undefined

  constructor(state: LatencyState, config: LatencyConfig = defaultLatencyConfig) {
    this.state = state
    this.config = config
    this.total = rawWeight(state)
    const margin = 1 - (config.matureWeight * (1 + 1e-9)) / this.total
    this.steadyUntilMs =
      this.total === 0
        ? Number.POSITIVE_INFINITY
        : margin >= 0
          ? state.atMs + (margin * config.halfLifeMs) / 0.7
          : Number.NEGATIVE_INFINITY
    this.#steady = this.total === 0 ? new Estimate(this, state.atMs) : new MatureEstimate(this)
  }

  /** `observedQuantile(state, q)`, remembered. */
  observed(q: number): number | undefined {
    if (q === this.#lastQ) return this.#last
    if (q === this.#otherQ) return this.#other
    const value = this.total > 0 ? quantileOfWeights(this.state.weights, this.total, q) : undefined
    this.#otherQ = this.#lastQ
    this.#other = this.#last
    this.#lastQ = q
    this.#last = value
    return value
  }

  /** The estimate at `nowMs`: what `quantile()` and `maturity()` answer for the state then. */
  estimate(nowMs: number): LatencyEstimate {
    return nowMs <= this.steadyUntilMs ? this.#steady : new Estimate(this, nowMs)
  }
}

/** An entry while certainly mature: the observed quantile itself (the prior's share is 0). */
class MatureEstimate implements LatencyEstimate {
  readonly maturity = "mature"
  readonly #entry: LatencyEntry

  constructor(entry: LatencyEntry) {
    this.#entry = entry
  }

  quantile(q: number): number {
    return this.#entry.observed(q)!
  }
}

/** An entry seen at one time: the decay is computed once, the observed quantiles come from the entry. */
class Estimate implements LatencyEstimate {
  readonly maturity: Maturity
  readonly #entry: LatencyEntry
  readonly #weight: number

  constructor(entry: LatencyEntry, nowMs: number) {
    this.#entry = entry
    this.#weight = entry.total === 0 ? 0 : entry.total * decayFactor(entry.state.atMs, nowMs, entry.config)
    this.maturity = maturityOf(this.#weight, entry.config)
  }

  quantile(q: number): number {
    return blend(this.#entry.observed(q), this.#weight, this.#entry.config)
  }
}

/** A snapshot for the auction; `undefined` state means the pair was never measured. */
export const latencyEstimate = (
  state: LatencyState | undefined,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): LatencyEstimate => new LatencyEntry(state ?? emptyLatencyState, config).estimate(nowMs)
