import { Clock, Context, Effect, Layer } from "effect"
import type { MarketBook, ModelList } from "../domain/Market.ts"
import { PROFILES, ROUTING_PROFILES } from "./Auction.ts"
import { ModelCatalog } from "./ModelCatalog.ts"
import { QuoteBook } from "./QuoteBook.ts"

const UNIT = "base units (6 decimals) per 1,000,000 tokens"
/** Reference mix for ordering a ladder: 3 input tokens per output token. */
const ladderCost = (t: { price_in: number; price_out: number }) => 3 * t.price_in + t.price_out

/** The market's public listings: the model list with live depth and best ask, and the book by price level. */
export class Listings extends Context.Service<
  Listings,
  { readonly models: Effect.Effect<ModelList>; readonly book: Effect.Effect<MarketBook> }
>()("router/market/Listings") {
  static readonly layer = Layer.effect(
    Listings,
    Effect.gen(function* () {
      const quoteBook = yield* QuoteBook
      const catalog = yield* ModelCatalog

      const models = Effect.gen(function* () {
        const live = yield* quoteBook.live
        const created = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const classes = catalog.classes.map((modelClass) => {
          const quotes = live.filter((q) => q.quote.model_class === modelClass.id).map((q) => q.quote)
          const best = quotes.reduce<(typeof quotes)[number] | undefined>(
            (acc, q) => (acc === undefined || ladderCost(q) < ladderCost(acc) ? q : acc),
            undefined
          )
          return {
            id: modelClass.id,
            object: "model" as const,
            created,
            owned_by: "svc-market",
            kind: "class" as const,
            description: modelClass.description,
            quality: modelClass.quality,
            capabilities: { ...modelClass.capabilities },
            max_context: modelClass.max_context,
            live_depth: quotes.length,
            best_ask: best === undefined ? null : { price_in: best.price_in, price_out: best.price_out },
            routing_profiles: [...ROUTING_PROFILES]
          }
        })
        const aliases = ROUTING_PROFILES.map((profile) => ({
          id: profile,
          object: "model" as const,
          created,
          owned_by: "svc-router",
          kind: "alias" as const,
          description: `Routing profile: the router picks the class and provider (premium cap ${PROFILES[profile].premiumCapBps} bps)`,
          quality: null,
          capabilities: null,
          max_context: null,
          live_depth: live.length,
          best_ask: null,
          routing_profiles: [profile]
        }))
        return { object: "list" as const, data: [...aliases, ...classes] }
      }).pipe(Effect.withSpan("Listings.models"))

      const book = Effect.gen(function* () {
        const live = yield* quoteBook.live
        const asOf = yield* Clock.currentTimeMillis
        const classes = catalog.classes.map((modelClass) => {
          const levels = new Map<
            string,
            { price_in: number; price_out: number; depth: number; capacity_rps: number }
          >()
          for (const { quote } of live) {
            if (quote.model_class !== modelClass.id) continue
            const key = `${quote.price_in}/${quote.price_out}`
            const level = levels.get(key) ?? {
              price_in: quote.price_in,
              price_out: quote.price_out,
              depth: 0,
              capacity_rps: 0
            }
            level.depth += 1
            level.capacity_rps += quote.capacity_rps
            levels.set(key, level)
          }
          const ladder = [...levels.values()].sort(
            (a, b) => ladderCost(a) - ladderCost(b) || a.price_out - b.price_out
          )
          return {
            model_class: modelClass.id,
            unit: UNIT,
            levels: ladder,
            depth: ladder.reduce((n, l) => n + l.depth, 0),
            capacity_rps: ladder.reduce((n, l) => n + l.capacity_rps, 0)
          }
        })
        return { as_of: asOf, classes }
      }).pipe(Effect.withSpan("Listings.book"))

      return Listings.of({ models, book })
    })
  )
}
