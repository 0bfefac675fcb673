import { Schema } from "effect"

const Tariff = Schema.Struct({ price_in: Schema.Int, price_out: Schema.Int })

/** What a losing bid's signed tariff would have charged for the same tokens (`Billing.charge`). */
export const RivalCounterfactual = Schema.Struct({
  /** `rival-<n>` in ascending order of counterfactual charge. */
  label: Schema.String,
  rank: Schema.Int,
  model_class: Schema.String,
  price_in: Schema.Int,
  price_out: Schema.Int,
  price_in_cached: Schema.optionalKey(Schema.Int),
  charge: Schema.Int
})
export type RivalCounterfactual = typeof RivalCounterfactual.Type

/**
 * The reconstructed auction of one served (or released) request (spec 1.5), at
 * `GET /v1/analytics/requests/:id`: the winner's own ask, the clearing tariff and who set it, what
 * each rival would have charged, the fee split. A token request carries its session and agent and
 * the winner's expected latency; an image request its image count (its unit says so).
 */
export const Economics = Schema.Struct({
  request_id: Schema.String,
  version: Schema.String,
  mechanism: Schema.String,
  profile: Schema.String,
  unit: Schema.String,
  images: Schema.optionalKey(Schema.Int),
  tokens: Schema.Struct({ input: Schema.Int, cached_input: Schema.Int, output: Schema.Int }),
  winner: Schema.Struct({
    provider: Schema.String,
    model: Schema.String,
    own_ask: Tariff,
    own_ask_charge: Schema.Int
  }),
  clear: Tariff,
  price_setter: Schema.String,
  charged: Schema.Int,
  authorized: Schema.Int,
  second_score_premium: Schema.Int,
  competitors: Schema.Array(RivalCounterfactual),
  quotes_competing: Schema.Int,
  session_id: Schema.optionalKey(Schema.NullOr(Schema.String)),
  agent: Schema.optionalKey(Schema.Record(Schema.String, Schema.String)),
  latency: Schema.Struct({
    ttft_ms: Schema.Int,
    winner_expected_ttft_ms: Schema.optionalKey(Schema.Int),
    winner_latency_penalty: Schema.optionalKey(Schema.Number)
  }),
  fee_split: Schema.Struct({
    router_fee_bps: Schema.Int,
    router_fee: Schema.Int,
    provider_share: Schema.Int,
    total: Schema.Int
  })
})
export type Economics = typeof Economics.Type

/** What a reservation released by the reaper (its request died with its instance) records. */
export const ReapedEconomics = Schema.Struct({ request_id: Schema.String, reaped: Schema.Literal(true) })
export type ReapedEconomics = typeof ReapedEconomics.Type

/** Any stored economics record. */
export const EconomicsRecord = Schema.Union([Economics, ReapedEconomics])
export type EconomicsRecord = typeof EconomicsRecord.Type
