import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { ChatCompletionRequest } from "../domain/Chat.ts"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import { SignedQuote } from "../domain/Quote.ts"
import { Provider, ProviderRegistration } from "../market/Providers.ts"
import { OperatorAuth } from "./AdminAuth.ts"
import { openAi } from "./ErrorWire.ts"

export class AdminApi extends HttpApiGroup.make("admin")
  .add(
    HttpApiEndpoint.post("registerProvider", "/v1/admin/providers", {
      payload: ProviderRegistration,
      success: Provider
    }),
    HttpApiEndpoint.get("listProviders", "/v1/admin/providers", {
      success: Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(Provider) })
    }),
    HttpApiEndpoint.post("disableProvider", "/v1/admin/providers/:id/disable", {
      params: { id: Schema.String },
      success: Provider,
      error: openAi(NotFound)
    }),
    HttpApiEndpoint.post("enableProvider", "/v1/admin/providers/:id/enable", {
      params: { id: Schema.String },
      success: Provider,
      error: openAi(NotFound)
    })
  )
  .middleware(OperatorAuth) {}

export const QuoteAccepted = Schema.Struct({
  accepted: Schema.Literal(true),
  quote_id: Schema.String,
  valid_until: Schema.Number
})

export class ProviderApi extends HttpApiGroup.make("provider").add(
  HttpApiEndpoint.post("ingestQuote", "/provider/quotes", {
    payload: SignedQuote,
    success: QuoteAccepted,
    error: [openAi(InvalidRequest), openAi(Unauthorized), openAi(Forbidden), openAi(Conflict)]
  })
) {}

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

export class MarketApi extends HttpApiGroup.make("market").add(
  HttpApiEndpoint.get("models", "/v1/models", {
    success: Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(ModelEntry) })
  }),
  HttpApiEndpoint.get("book", "/v1/market/book", {
    success: Schema.Struct({ as_of: Schema.Number, classes: Schema.Array(BookClass) })
  })
) {}

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
      score_breakdown: Schema.Unknown
    })
  ),
  premium_cap_bps: Schema.NullOr(Schema.Number),
  candidates: Schema.Struct({ considered: Schema.Number, eligible: Schema.Number, excluded: Schema.Number }),
  data_maturity: Schema.Record(Schema.String, Schema.Number)
})

export class RoutingApi extends HttpApiGroup.make("routing").add(
  HttpApiEndpoint.post("preview", "/v1/routing/preview", {
    payload: ChatCompletionRequest,
    success: Schema.Struct({
      object: Schema.Literal("routing.preview"),
      prompt_tokens: Schema.Number,
      max_tokens: Schema.Number,
      profiles: Schema.Array(PreviewWinner)
    }),
    error: openAi(InvalidRequest)
  })
) {}
