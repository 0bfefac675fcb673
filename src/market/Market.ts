import { Clock, Context, Effect, Layer } from "effect"
import { type AuctionOutcome, type AuctionRequest, runAuction } from "./Auction.ts"
import { Latency } from "./Latency.ts"
import { ModelCatalog } from "./ModelCatalog.ts"
import { QuoteBook } from "./QuoteBook.ts"

export type MarketRequest = Omit<AuctionRequest, "nowMs"> & {
  /** Opening a budget session: only quotes that sign a session tariff (cached price and TTL) compete. */
  readonly requireSessionTariff?: boolean | undefined
}

/** Runs the RFQ: the live eligible book, measured latency and the catalog into the pure auction. */
export class Market extends Context.Service<
  Market,
  { readonly clear: (request: MarketRequest) => Effect.Effect<AuctionOutcome> }
>()("router/market/Market") {
  static readonly layer = Layer.effect(
    Market,
    Effect.gen(function* () {
      const book = yield* QuoteBook
      const latency = yield* Latency
      const catalog = yield* ModelCatalog
      const clear = Effect.fn("Market.clear")(function* (request: MarketRequest) {
        const nowMs = yield* Clock.currentTimeMillis
        const live = yield* book.live
        const quotes = request.requireSessionTariff
          ? live.filter((q) => q.quote.price_in_cached !== undefined && q.quote.session_ttl_s !== undefined)
          : live
        const lookup = yield* latency.lookup
        const outcome = runAuction({ ...request, nowMs }, quotes, catalog.classes, lookup)
        yield* Effect.annotateCurrentSpan(
          outcome._tag === "Cleared"
            ? {
                requested: request.requested,
                winner: outcome.winner.provider_id,
                model_class: outcome.winner.model_class,
                price_setter: outcome.priceSetter,
                quotes_competing: outcome.eligible
              }
            : { requested: request.requested, no_eligible_quote: outcome.reason }
        )
        return outcome
      })
      return Market.of({ clear })
    })
  )
}
