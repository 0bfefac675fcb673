import { Schema } from "effect"

/** The market's public views: the model list, the book of live standing quotes, the routing preview. */

const Tariff = Schema.Struct({ price_in: Schema.Number, price_out: Schema.Number })

export const ModelEntry = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model"),
  created: Schema.Number,
  owned_by: Schema.String,
  kind: Schema.Literals(["class", "alias"]),
  description: Schema.String,
  quality: Schema.NullOr(Schema.Number),
  capabilities: Schema.NullOr(Schema.Record(Schema.String, Schema.Boolean)),
  max_context: Schema.NullOr(Schema.Number),
  live_depth: Schema.Number,
  best_ask: Schema.NullOr(Tariff),
  routing_profiles: Schema.Array(Schema.String)
})

export const BookLevel = Schema.Struct({
  price_in: Schema.Number,
  price_out: Schema.Number,
  depth: Schema.Number,
  capacity_rps: Schema.Number
})
export const BookClass = Schema.Struct({
  model_class: Schema.String,
  unit: Schema.String,
  levels: Schema.Array(BookLevel),
  depth: Schema.Number,
  capacity_rps: Schema.Number
})

/** `GET /v1/models`: routing aliases, then the catalog's classes with their live depth and best ask. */
export const ModelList = Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(ModelEntry) })
export type ModelList = typeof ModelList.Type

/** `GET /v1/market/book`: live standing quotes per class, aggregated by price level. */
export const MarketBook = Schema.Struct({ as_of: Schema.Number, classes: Schema.Array(BookClass) })
export type MarketBook = typeof MarketBook.Type

/** How a bid was scored (docs/auction.md): its own cost, and the penalties its multiplier came from. */
export const ScoreBreakdown = Schema.Struct({
  cost: Schema.Number,
  quality: Schema.Number,
  quality_penalty: Schema.Number,
  latency_ms: Schema.Number,
  latency_quantile: Schema.Number,
  latency_penalty: Schema.Number,
  maturity: Schema.Literals(["cold", "warming", "mature"]),
  multiplier_bps: Schema.Number,
  /** When the request named a task: how its ratings moved the class's quality (docs/auction.md 4). */
  task_fit: Schema.optionalKey(
    Schema.Struct({
      task: Schema.String,
      ratings: Schema.Number,
      mean: Schema.NullOr(Schema.Number),
      catalog_quality: Schema.Number,
      quality_shift: Schema.Number
    })
  )
})

export const PreviewWinner = Schema.Struct({
  profile: Schema.String,
  requested_model: Schema.String,
  mechanism_version: Schema.String,
  outcome: Schema.Literals(["cleared", "no_eligible_quote"]),
  reason: Schema.NullOr(Schema.String),
  winner: Schema.NullOr(
    Schema.Struct({
      provider: Schema.String,
      model: Schema.String,
      own_ask: Tariff,
      clear: Tariff,
      price_setter: Schema.String,
      worst_case_charge: Schema.Number,
      premium: Schema.Number,
      score_breakdown: ScoreBreakdown
    })
  ),
  premium_cap_bps: Schema.NullOr(Schema.Number),
  candidates: Schema.Struct({ considered: Schema.Number, eligible: Schema.Number, excluded: Schema.Number }),
  data_maturity: Schema.Record(Schema.String, Schema.Number)
})

/** `POST /v1/routing/preview`: how each routing profile would clear this request now; nothing is reserved. */
export const RoutingPreview = Schema.Struct({
  object: Schema.Literal("routing.preview"),
  /** The request's `routing.task`, whose ratings move class quality in every variant but the last. */
  task: Schema.NullOr(Schema.String),
  prompt_tokens: Schema.Number,
  max_tokens: Schema.Number,
  profiles: Schema.Array(PreviewWinner)
})
export type RoutingPreview = typeof RoutingPreview.Type
