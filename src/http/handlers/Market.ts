import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { RoutingPreview } from "../../inference/Preview.ts"
import { Listings } from "../../market/Listings.ts"
import { Providers } from "../../market/Providers.ts"
import { QuoteBook } from "../../market/QuoteBook.ts"
import { Api } from "../Api.ts"
export const AdminHandlers = HttpApiBuilder.group(
  Api,
  "admin",
  Effect.fn(function* (handlers) {
    const providers = yield* Providers
    return handlers
      .handle("registerProvider", ({ payload }) => providers.register(payload))
      .handle("listProviders", () =>
        Effect.map(providers.list, (data) => ({ object: "list" as const, data }))
      )
      .handle("disableProvider", ({ params }) => providers.setEnabled(params.id, false))
      .handle("enableProvider", ({ params }) => providers.setEnabled(params.id, true))
  })
)

export const ProviderHandlers = HttpApiBuilder.group(
  Api,
  "provider",
  Effect.fn(function* (handlers) {
    const book = yield* QuoteBook
    return handlers.handle("ingestQuote", ({ payload }) =>
      Effect.map(book.ingest(payload), (q) => ({
        accepted: true as const,
        quote_id: q.quote_id,
        valid_until: q.valid_until
      }))
    )
  })
)

export const MarketHandlers = HttpApiBuilder.group(
  Api,
  "market",
  Effect.fn(function* (handlers) {
    const listings = yield* Listings
    return handlers.handle("models", () => listings.models).handle("book", () => listings.book)
  })
)

export const RoutingHandlers = HttpApiBuilder.group(
  Api,
  "routing",
  Effect.fn(function* (handlers) {
    const routing = yield* RoutingPreview
    return handlers.handle("preview", ({ payload }) => routing.preview(payload))
  })
)
