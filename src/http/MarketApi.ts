import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { ChatCompletionRequest } from "../domain/Chat.ts"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import { MarketBook, ModelList, RoutingPreview } from "../domain/Market.ts"
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

export class MarketApi extends HttpApiGroup.make("market").add(
  HttpApiEndpoint.get("models", "/v1/models", {
    success: ModelList
  }),
  HttpApiEndpoint.get("book", "/v1/market/book", {
    success: MarketBook
  })
) {}

export class RoutingApi extends HttpApiGroup.make("routing").add(
  HttpApiEndpoint.post("preview", "/v1/routing/preview", {
    payload: ChatCompletionRequest,
    success: RoutingPreview,
    error: openAi(InvalidRequest)
  })
) {}
