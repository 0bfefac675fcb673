import { Schema } from "effect"
import { TaskLabel } from "./Chat.ts"
import { BookClass, ModelEntry } from "./Market.ts"

/**
 * Public market data (spec 4.4): what cleared, as candles, an index and a rolling 24 h summary, and the
 * snapshot the live events repeat. Prices are base units per 1,000,000 tokens; the one price a candle and
 * the index track is the blended cleared price of each request at its actual token mix
 * (docs/decisions.md D121). No field names a customer, a prompt or a reply.
 */

/** One cleared request on the tape. */
export const Clear = Schema.Struct({
  request_id: Schema.String,
  /** Unix milliseconds: when the request was admitted (its receipt's `created_at`). */
  at: Schema.Number,
  model_class: Schema.String,
  provider: Schema.String,
  profile: Schema.String,
  price_in: Schema.Number,
  price_out: Schema.Number,
  /** The blended cleared price of this request, or null when it metered no tokens. */
  price: Schema.NullOr(Schema.Number),
  tokens_in: Schema.Number,
  tokens_out: Schema.Number,
  tokens_cached: Schema.Number,
  charged: Schema.Number,
  ttft_ms: Schema.Number,
  price_setter: Schema.String,
  quotes_competing: Schema.Number
})
export type Clear = typeof Clear.Type

/** One bucket: OHLC and the token-weighted VWAP of the blended price; all null when nothing cleared. */
export const Candle = Schema.Struct({
  /** Bucket start, unix milliseconds. */
  t: Schema.Number,
  open: Schema.NullOr(Schema.Number),
  high: Schema.NullOr(Schema.Number),
  low: Schema.NullOr(Schema.Number),
  close: Schema.NullOr(Schema.Number),
  vwap: Schema.NullOr(Schema.Number),
  volume_tokens: Schema.Number,
  volume: Schema.Number,
  count: Schema.Number
})
export type Candle = typeof Candle.Type

const Series = {
  unit: Schema.String,
  window_ms: Schema.Number,
  bucket_ms: Schema.Number,
  from: Schema.Number,
  to: Schema.Number
}

/** `GET /v1/market/candles`. */
export const Candles = Schema.Struct({
  object: Schema.Literal("market.candles"),
  model_class: Schema.NullOr(Schema.String),
  ...Series,
  candles: Schema.Array(Candle)
})
export type Candles = typeof Candles.Type

export const IndexComponent = Schema.Struct({
  model_class: Schema.String,
  /** The class's share of the basket's cleared tokens in the window; the weights sum to 1. */
  weight: Schema.Number,
  volume_tokens: Schema.Number,
  vwap: Schema.NullOr(Schema.Number)
})

export const IndexPoint = Schema.Struct({ t: Schema.Number, value: Schema.NullOr(Schema.Number) })

/** `GET /v1/market/index`: the token-weighted composite of the basket's VWAPs (D122). */
export const MarketIndex = Schema.Struct({
  object: Schema.Literal("market.index"),
  classes: Schema.Array(Schema.String),
  ...Series,
  value: Schema.NullOr(Schema.Number),
  components: Schema.Array(IndexComponent),
  series: Schema.Array(IndexPoint)
})
export type MarketIndex = typeof MarketIndex.Type

/** What cleared in one class over a window: requests, tokens, base units, and the blended price's VWAP and range. */
const ClassVolume = {
  model_class: Schema.String,
  count: Schema.Number,
  volume_tokens: Schema.Number,
  volume: Schema.Number,
  vwap: Schema.NullOr(Schema.Number),
  high: Schema.NullOr(Schema.Number),
  low: Schema.NullOr(Schema.Number)
}

/** One class over the rolling 24 h window. */
export const ClassStats = Schema.Struct({
  ...ClassVolume,
  open: Schema.NullOr(Schema.Number),
  last: Schema.NullOr(Schema.Number),
  /** `last - open`, and the same in basis points of `open`. */
  change: Schema.NullOr(Schema.Number),
  change_bps: Schema.NullOr(Schema.Number),
  ttft_p50_ms: Schema.NullOr(Schema.Number),
  ttft_p90_ms: Schema.NullOr(Schema.Number)
})
export type ClassStats = typeof ClassStats.Type

/** `GET /v1/market/stats`. */
export const MarketStats = Schema.Struct({
  object: Schema.Literal("market.stats"),
  unit: Schema.String,
  window_ms: Schema.Number,
  as_of: Schema.Number,
  classes: Schema.Array(ClassStats)
})
export type MarketStats = typeof MarketStats.Type

/**
 * `GET /v1/market/snapshot`, and every frame of `GET /v1/market/events` (the same schema decodes
 * both): models, book and economics, with the instance's `sequence`, which only grows.
 */
export const MarketSnapshot = Schema.Struct({
  object: Schema.Literal("market.snapshot"),
  as_of: Schema.Number,
  sequence: Schema.Number,
  unit: Schema.String,
  models: Schema.Array(ModelEntry),
  book: Schema.Array(BookClass),
  economics: Schema.Struct({
    last_clears: Schema.Array(Clear),
    index: Schema.Struct({
      value: Schema.NullOr(Schema.Number),
      components: Schema.Array(IndexComponent)
    }),
    stats: Schema.Array(ClassStats)
  })
})
export type MarketSnapshot = typeof MarketSnapshot.Type

/** Aggregates of one class over a window (hourly rollups). */
const ClassFigures = {
  ...ClassVolume,
  ttft_avg_ms: Schema.NullOr(Schema.Number)
}

/** `GET /v1/analytics/market`: per-class cleared prices, concentration (HHI of provider volume) and latency. */
export const AnalyticsMarket = Schema.Struct({
  object: Schema.Literal("analytics.market"),
  unit: Schema.String,
  window_ms: Schema.Number,
  from: Schema.Number,
  hhi: Schema.NullOr(Schema.Number),
  classes: Schema.Array(
    Schema.Struct({ ...ClassFigures, providers: Schema.Number, hhi: Schema.NullOr(Schema.Number) })
  )
})
export type AnalyticsMarket = typeof AnalyticsMarket.Type

/** `GET /v1/analytics/rollups`: hourly aggregates per class, kept 90 days. */
export const Rollups = Schema.Struct({
  object: Schema.Literal("analytics.rollups"),
  unit: Schema.String,
  window_ms: Schema.Number,
  from: Schema.Number,
  rollups: Schema.Array(Schema.Struct({ hour: Schema.Number, ...ClassFigures }))
})
export type Rollups = typeof Rollups.Type

/** `GET /v1/analytics/dashboard`: the whole market per bucket, ready for a chart. */
export const Dashboard = Schema.Struct({
  object: Schema.Literal("analytics.dashboard"),
  ...Series,
  buckets: Schema.Array(
    Schema.Struct({
      t: Schema.Number,
      count: Schema.Number,
      volume_tokens: Schema.Number,
      volume: Schema.Number,
      vwap: Schema.NullOr(Schema.Number),
      ttft_avg_ms: Schema.NullOr(Schema.Number)
    })
  )
})
export type Dashboard = typeof Dashboard.Type

/**
 * `GET /v1/analytics/leaderboard`: customers by aggregate spend, by rank only (no wallet, no label: D128),
 * and providers by cleared volume.
 */
export const MarketLeaderboard = Schema.Struct({
  object: Schema.Literal("analytics.leaderboard"),
  window_ms: Schema.Number,
  customers: Schema.Array(
    Schema.Struct({ rank: Schema.Number, spend: Schema.Number, requests: Schema.Number })
  ),
  providers: Schema.Array(
    Schema.Struct({
      rank: Schema.Number,
      provider: Schema.String,
      volume: Schema.Number,
      volume_tokens: Schema.Number,
      clears: Schema.Number,
      share: Schema.Number
    })
  )
})
export type MarketLeaderboard = typeof MarketLeaderboard.Type

/** `GET /v1/analytics/providers/:id`: served volume and reliability over the last 24 h, and live quotes. */
export const ProviderAnalytics = Schema.Struct({
  object: Schema.Literal("analytics.provider"),
  provider: Schema.String,
  window_ms: Schema.Number,
  clears: Schema.Number,
  volume: Schema.Number,
  volume_tokens: Schema.Number,
  /** Its clears over all clears of the classes it served in the window. */
  win_share: Schema.NullOr(Schema.Number),
  /** Requests it won and served, and those it won but failed before delivering (released) or part-way. */
  requests: Schema.Number,
  released: Schema.Number,
  partial: Schema.Number,
  /** Requests it won whose reply came from a fallback provider. */
  failovers: Schema.Number,
  error_rate: Schema.NullOr(Schema.Number),
  ttft_p50_ms: Schema.NullOr(Schema.Number),
  ttft_p90_ms: Schema.NullOr(Schema.Number),
  ttft_p99_ms: Schema.NullOr(Schema.Number),
  quotes: Schema.Array(
    Schema.Struct({
      model_class: Schema.String,
      price_in: Schema.Number,
      price_out: Schema.Number,
      capacity_rps: Schema.Number,
      valid_until: Schema.Number
    })
  )
})
export type ProviderAnalytics = typeof ProviderAnalytics.Type

/** `POST /v1/routing/feedback/:id`: one explicit rating of a served request. */
export const FeedbackRequest = Schema.Struct({
  rating: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 5 })),
  task: Schema.optional(TaskLabel)
})
export type FeedbackRequest = typeof FeedbackRequest.Type

export const FeedbackRecorded = Schema.Struct({
  object: Schema.Literal("routing.feedback"),
  request_id: Schema.String,
  model_class: Schema.String,
  rating: Schema.Number,
  task: Schema.String
})
export type FeedbackRecorded = typeof FeedbackRecorded.Type

/** `GET /v1/analytics/task-fit`: ratings per (class, task), aggregated; nothing names who rated. */
export const TaskFit = Schema.Struct({
  object: Schema.Literal("analytics.task_fit"),
  scale: Schema.String,
  fits: Schema.Array(
    Schema.Struct({
      model_class: Schema.String,
      task: Schema.String,
      ratings: Schema.Number,
      mean: Schema.Number
    })
  )
})
export type TaskFit = typeof TaskFit.Type
