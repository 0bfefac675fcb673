import type { Candle, ClassStats, Clear } from "../domain/MarketData.ts"

/**
 * The pure arithmetic of market data: the blended price of a clear, candles with their token-weighted
 * VWAP, the composite index and its weights, the 24 h stats and the HHI. Everything here is a function of
 * the clearing records alone (docs/decisions.md D120–D123); the service only chooses the records.
 */

/** One clearing record as the service holds it (a `market_clears` row). */
export interface ClearRecord {
  readonly id: number
  readonly requestId: string
  /** Unix milliseconds. */
  readonly at: number
  readonly modelClass: string
  readonly provider: string
  readonly profile: string
  readonly priceIn: number
  readonly priceOut: number
  readonly tokensIn: number
  readonly tokensOut: number
  readonly tokensCached: number
  /** The exact charge times 1,000,000: token counts times per-million prices (`Billing.chargeNumerator`). */
  readonly chargeNum: number
  readonly charged: number
  readonly ttftMs: number
  readonly priceSetter: string
  readonly quotesCompeting: number
}

export const MINUTE_MS = 60_000

export const PRICE_UNIT = "base units (6 decimals) per 1,000,000 tokens, blended at each request's token mix"

/** `numerator / denominator` rounded half up, exact for any sizes. */
export const roundDiv = (numerator: bigint, denominator: bigint): number =>
  Number((2n * numerator + denominator) / (2n * denominator))

export const tokensOf = (c: ClearRecord) => c.tokensIn + c.tokensOut

/** The blended cleared price per 1M tokens at the request's own mix (D121); null with no tokens. */
export const blendedPrice = (c: ClearRecord): number | null => {
  const tokens = tokensOf(c)
  return tokens > 0 ? roundDiv(BigInt(c.chargeNum), BigInt(tokens)) : null
}

/** Orders clears by time, then by record id (the order open and close are read in). */
export const byTime = (a: ClearRecord, b: ClearRecord) => a.at - b.at || a.id - b.id

/**
 * A running aggregate of clears; VWAP is Σ charge numerators / Σ tokens, exact. Open and close are the
 * prices of the earliest and latest priced clear (by time, then id), whatever order they are added in.
 */
export interface Aggregate {
  count: number
  volume: number
  tokens: number
  num: bigint
  open: number | null
  close: number | null
  high: number | null
  low: number | null
  openAt: number
  openId: number
  closeAt: number
  closeId: number
}

export const emptyAggregate = (): Aggregate => ({
  count: 0,
  volume: 0,
  tokens: 0,
  num: 0n,
  open: null,
  close: null,
  high: null,
  low: null,
  openAt: Number.POSITIVE_INFINITY,
  openId: 0,
  closeAt: Number.NEGATIVE_INFINITY,
  closeId: 0
})

/** Folds `from` into `into` (aggregates of disjoint sets of clears). */
export const mergeAggregate = (into: Aggregate, from: Aggregate): void => {
  into.count += from.count
  into.volume += from.volume
  if (from.open === null) return
  into.tokens += from.tokens
  into.num += from.num
  if (
    into.open === null ||
    from.openAt < into.openAt ||
    (from.openAt === into.openAt && from.openId < into.openId)
  ) {
    into.open = from.open
    into.openAt = from.openAt
    into.openId = from.openId
  }
  if (
    into.close === null ||
    from.closeAt > into.closeAt ||
    (from.closeAt === into.closeAt && from.closeId > into.closeId)
  ) {
    into.close = from.close
    into.closeAt = from.closeAt
    into.closeId = from.closeId
  }
  into.high = into.high === null ? from.high : Math.max(into.high, from.high!)
  into.low = into.low === null ? from.low : Math.min(into.low, from.low!)
}

/** Adds one clear to an aggregate. */
export const addClear = (agg: Aggregate, c: ClearRecord): void => {
  const price = blendedPrice(c)
  mergeAggregate(agg, {
    count: 1,
    volume: c.charged,
    tokens: price === null ? 0 : tokensOf(c),
    num: price === null ? 0n : BigInt(c.chargeNum),
    open: price,
    close: price,
    high: price,
    low: price,
    openAt: c.at,
    openId: c.id,
    closeAt: c.at,
    closeId: c.id
  })
}

export const vwapOf = (agg: Aggregate): number | null =>
  agg.tokens > 0 ? roundDiv(agg.num, BigInt(agg.tokens)) : null

export const candleOf = (t: number, agg: Aggregate): Candle => ({
  t,
  open: agg.open,
  high: agg.high,
  low: agg.low,
  close: agg.close,
  vwap: vwapOf(agg),
  volume_tokens: agg.tokens,
  volume: agg.volume,
  count: agg.count
})

/** A resolved time grid: `points` buckets of `bucketMs` from `from` (inclusive) to `to` (exclusive). */
export interface Grid {
  readonly windowMs: number
  readonly bucketMs: number
  readonly from: number
  readonly to: number
  readonly points: number
}

export interface Bounds {
  /** A longer window has buckets of whole minutes (read from the per-minute aggregates, D231). */
  readonly minuteBucketsAboveMs: number
  /** The largest window an endpoint serves; a longer one is refused. */
  readonly maxWindowMs: number
  /** The most buckets a series has; a narrower bucket is widened to fit. */
  readonly maxPoints: number
  readonly minBucketMs: number
  readonly defaultWindowMs: number
  readonly defaultPoints: number
}

/** Candles and the index: 24 h at most (the window kept in memory), at most 1,440 points (D123). */
export const SERIES_BOUNDS: Bounds = {
  minuteBucketsAboveMs: 3_600_000,
  maxWindowMs: 86_400_000,
  maxPoints: 1_440,
  minBucketMs: 1_000,
  defaultWindowMs: 3_600_000,
  defaultPoints: 60
}

export type GridError = { readonly param: "window_ms" | "bucket_ms"; readonly message: string }

/**
 * The grid a request asks for: a window outside (0, max] is refused; the bucket is clamped into
 * [max(minimum, window / maxPoints), window], then a bucket of a minute or more, and any bucket of a
 * window longer than `minuteBucketsAboveMs`, is rounded down to whole minutes (at least one; D231), any
 * other to whole seconds (at least one; D551), and the grid ends with the bucket holding `now`.
 */
export const resolveGrid = (
  now: number,
  bounds: Bounds,
  windowMs: number | undefined,
  bucketMs: number | undefined
):
  | { readonly _tag: "Grid"; readonly grid: Grid }
  | { readonly _tag: "Refused"; readonly error: GridError } => {
  const window = windowMs ?? bounds.defaultWindowMs
  if (!Number.isSafeInteger(window) || window <= 0 || window > bounds.maxWindowMs) {
    return {
      _tag: "Refused",
      error: {
        param: "window_ms",
        message: `window_ms must be an integer in 1..${bounds.maxWindowMs} (got ${windowMs})`
      }
    }
  }
  if (bucketMs !== undefined && (!Number.isSafeInteger(bucketMs) || bucketMs <= 0)) {
    return {
      _tag: "Refused",
      error: { param: "bucket_ms", message: `bucket_ms must be a positive integer (got ${bucketMs})` }
    }
  }
  const floor = Math.max(bounds.minBucketMs, Math.ceil(window / bounds.maxPoints))
  const wanted = bucketMs ?? Math.ceil(window / bounds.defaultPoints)
  const clamped = Math.min(Math.max(wanted, floor), Math.max(window, bounds.minBucketMs))
  const bucket =
    clamped >= MINUTE_MS || window > bounds.minuteBucketsAboveMs
      ? Math.max(MINUTE_MS, Math.floor(clamped / MINUTE_MS) * MINUTE_MS)
      : // Down to whole seconds, but never under the narrowest bucket that keeps the grid within its points.
        Math.max(Math.ceil(floor / 1_000) * 1_000, Math.floor(clamped / 1_000) * 1_000)
  const points = Math.ceil(window / bucket)
  const to = (Math.floor(now / bucket) + 1) * bucket
  return {
    _tag: "Grid",
    grid: { windowMs: window, bucketMs: bucket, from: to - points * bucket, to, points }
  }
}

/** One aggregate per bucket of the grid, over clears sorted `byTime`. */
export const bucketize = (clears: ReadonlyArray<ClearRecord>, grid: Grid): Array<Aggregate> => {
  const buckets = Array.from({ length: grid.points }, emptyAggregate)
  for (const c of clears) {
    if (c.at < grid.from || c.at >= grid.to) continue
    addClear(buckets[Math.floor((c.at - grid.from) / grid.bucketMs)]!, c)
  }
  return buckets
}

export const candles = (clears: ReadonlyArray<ClearRecord>, grid: Grid): Array<Candle> =>
  bucketize(clears, grid).map((agg, i) => candleOf(grid.from + i * grid.bucketMs, agg))

export interface IndexResult {
  readonly components: ReadonlyArray<{
    readonly model_class: string
    readonly weight: number
    readonly volume_tokens: number
    readonly vwap: number | null
  }>
  readonly series: ReadonlyArray<{ readonly t: number; readonly value: number | null }>
  readonly value: number | null
}

/**
 * The composite index (D122): each class weighs its share of the basket's cleared tokens in the window
 * (the weights sum to 1; equal when nothing cleared). A bucket's value is Σ weight × the class's VWAP in
 * that bucket, carrying its last VWAP forward through buckets where it did not trade (and its first one
 * back to the window's start). Null until anything cleared.
 */
export const compositeIndex = (
  clears: ReadonlyArray<ClearRecord>,
  basket: ReadonlyArray<string>,
  grid: Grid
): IndexResult =>
  compositeIndexOf(
    basket.map((modelClass) => ({
      modelClass,
      buckets: bucketize(
        clears.filter((c) => c.modelClass === modelClass),
        grid
      )
    })),
    grid
  )

/** The index from each basket class's aggregates on the grid (one per bucket). */
export const compositeIndexOf = (
  basket: ReadonlyArray<{ readonly modelClass: string; readonly buckets: ReadonlyArray<Aggregate> }>,
  grid: Grid
): IndexResult => {
  const perClass = basket.map(({ modelClass, buckets }) => {
    const whole = emptyAggregate()
    for (const b of buckets) mergeAggregate(whole, b)
    return { modelClass, buckets, tokens: whole.tokens, vwap: vwapOf(whole) }
  })
  const total = perClass.reduce((n, c) => n + c.tokens, 0)
  const weights = perClass.map((c) => (total > 0 ? c.tokens / total : 1 / basket.length))
  const paths = perClass.map((c) => {
    const prices = c.buckets.map(vwapOf)
    let carried = prices.find((p) => p !== null) ?? null
    return prices.map((p) => {
      if (p !== null) carried = p
      return carried
    })
  })
  const series = Array.from({ length: grid.points }, (_, i) => {
    if (total === 0) return { t: grid.from + i * grid.bucketMs, value: null }
    let value = 0
    perClass.forEach((c, k) => {
      if (c.tokens > 0) value += weights[k]! * paths[k]![i]!
    })
    return { t: grid.from + i * grid.bucketMs, value: Math.round(value) }
  })
  return {
    components: perClass.map((c, k) => ({
      model_class: c.modelClass,
      weight: weights[k]!,
      volume_tokens: c.tokens,
      vwap: c.vwap
    })),
    series,
    value: series.length === 0 ? null : series[series.length - 1]!.value
  }
}

/** Nearest-rank quantile of sorted values; null when there are none. */
export const quantile = (sorted: ReadonlyArray<number>, q: number): number | null =>
  sorted.length === 0 ? null : sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)]!

/** One class's clearing summary over the clears given. */
export const classStats = (modelClass: string, clears: ReadonlyArray<ClearRecord>): ClassStats => {
  const agg = emptyAggregate()
  const ttfts: Array<number> = []
  for (const c of clears) {
    if (c.modelClass !== modelClass) continue
    addClear(agg, c)
    ttfts.push(c.ttftMs)
  }
  ttfts.sort((a, b) => a - b)
  return statsOf(modelClass, agg, (q) => quantile(ttfts, q))
}

/** A class's summary from its aggregate and the quantiles of its TTFTs. */
export const statsOf = (
  modelClass: string,
  agg: Aggregate,
  ttftQuantile: (q: number) => number | null
): ClassStats => {
  const change = agg.open === null || agg.close === null ? null : agg.close - agg.open
  return {
    model_class: modelClass,
    count: agg.count,
    volume_tokens: agg.tokens,
    volume: agg.volume,
    vwap: vwapOf(agg),
    high: agg.high,
    low: agg.low,
    open: agg.open,
    last: agg.close,
    change,
    change_bps: change === null || !agg.open ? null : Math.round((change * 10_000) / agg.open),
    ttft_p50_ms: ttftQuantile(0.5),
    ttft_p90_ms: ttftQuantile(0.9)
  }
}

/**
 * Herfindahl–Hirschman index of shares of a total, in points 0..10,000 (one seller: 10,000);
 * null when nothing was sold.
 */
export const hhi = (volumes: ReadonlyArray<number>): number | null => {
  const total = volumes.reduce((a, b) => a + b, 0)
  if (total <= 0) return null
  return Math.round(volumes.reduce((sum, v) => sum + ((100 * v) / total) ** 2, 0))
}

/** The public tape entry of a clearing record. */
export const tapeEntry = (c: ClearRecord): Clear => ({
  request_id: c.requestId,
  at: c.at,
  model_class: c.modelClass,
  provider: c.provider,
  profile: c.profile,
  price_in: c.priceIn,
  price_out: c.priceOut,
  price: blendedPrice(c),
  tokens_in: c.tokensIn,
  tokens_out: c.tokensOut,
  tokens_cached: c.tokensCached,
  charged: c.charged,
  ttft_ms: c.ttftMs,
  price_setter: c.priceSetter,
  quotes_competing: c.quotesCompeting
})
