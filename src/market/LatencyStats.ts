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
}

const FIRST_UPPER_MS = 10
const GROWTH = 1.2
/** Upper bounds 10 ms, 12 ms, ... up to about 130 s; slower samples land in the last bucket. */
export const BUCKET_COUNT = 53
const upperBound = (i: number): number => FIRST_UPPER_MS * GROWTH ** i
const lowerBound = (i: number): number => (i === 0 ? 0 : upperBound(i - 1))

export const emptyLatencyState: LatencyState = {
  weights: Array.from({ length: BUCKET_COUNT }, () => 0),
  atMs: 0
}

const bucketOf = (ttftMs: number): number => {
  if (ttftMs <= FIRST_UPPER_MS) return 0
  const i = Math.ceil(Math.log(ttftMs / FIRST_UPPER_MS) / Math.log(GROWTH) - 1e-9)
  return Math.min(BUCKET_COUNT - 1, Math.max(0, i))
}

const decayFactor = (fromMs: number, toMs: number, config: LatencyConfig): number =>
  toMs <= fromMs ? 1 : 2 ** (-(toMs - fromMs) / config.halfLifeMs)

const rawWeight = (state: LatencyState): number => state.weights.reduce((sum, w) => sum + w, 0)

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
  return { weights, atMs }
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
  const weight = effectiveWeight(state, nowMs, config)
  return weight >= config.matureWeight ? "mature" : weight >= config.warmingWeight ? "warming" : "cold"
}

/**
 * The q-quantile of the measurements alone (linear inside a bucket), or undefined without data.
 * Decay scales every bucket alike, so this does not depend on the current time.
 */
export const observedQuantile = (state: LatencyState, q: number): number | undefined => {
  const total = rawWeight(state)
  if (!(total > 0)) return undefined
  const target = Math.min(1, Math.max(0, q)) * total
  let below = 0
  for (let i = 0; i < BUCKET_COUNT; i++) {
    const w = state.weights[i] ?? 0
    if (w > 0 && below + w >= target) {
      const fraction = Math.min(1, Math.max(0, (target - below) / w))
      return lowerBound(i) + fraction * (upperBound(i) - lowerBound(i))
    }
    below += w
  }
  return upperBound(BUCKET_COUNT - 1)
}

/** The TTFT quantile the router plans with: observations blended with the prior by data maturity. */
export const quantile = (
  state: LatencyState,
  q: number,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): number => {
  const observed = observedQuantile(state, q)
  if (observed === undefined) return config.priorMs
  const share = Math.min(1, effectiveWeight(state, nowMs, config) / config.matureWeight)
  return Math.max(observed, (1 - share) * config.priorMs + share * observed)
}

/** A snapshot for the auction; `undefined` state means the pair was never measured. */
export const latencyEstimate = (
  state: LatencyState | undefined,
  nowMs: number,
  config: LatencyConfig = defaultLatencyConfig
): LatencyEstimate => {
  const current = state ?? emptyLatencyState
  return {
    quantile: (q) => quantile(current, q, nowMs, config),
    maturity: maturity(current, nowMs, config)
  }
}
