import { Clock, Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { marketRequestOf } from "../../inference/Requirements.ts"
import { estimatePromptTokens } from "../../inference/Tokens.ts"
import { type AuctionOutcome, PROFILES, ROUTING_PROFILES } from "../../market/Auction.ts"
import { ModelCatalog } from "../../market/ModelCatalog.ts"
import { Providers } from "../../market/Providers.ts"
import { QuoteBook } from "../../market/QuoteBook.ts"
import { type MarketRequest, Rfq } from "../../market/Rfq.ts"
import { Api } from "../Api.ts"

const UNIT = "base units (6 decimals) per 1,000,000 tokens"
/** Reference mix for ordering a ladder: 3 input tokens per output token. */
const ladderCost = (t: { price_in: number; price_out: number }) => 3 * t.price_in + t.price_out

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
    const book = yield* QuoteBook
    const catalog = yield* ModelCatalog
    return handlers
      .handle("models", () =>
        Effect.gen(function* () {
          const live = yield* book.live
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
        })
      )
      .handle("book", () =>
        Effect.gen(function* () {
          const live = yield* book.live
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
        })
      )
  })
)

const previewOf = (profile: string, request: MarketRequest, outcome: AuctionOutcome) => {
  const maturity: Record<string, number> = { cold: 0, warming: 0, mature: 0 }
  if (outcome._tag === "Cleared") {
    for (const bid of outcome.bids)
      maturity[bid.score_breakdown.maturity] = (maturity[bid.score_breakdown.maturity] ?? 0) + 1
  }
  return {
    profile,
    requested_model: request.requested,
    mechanism_version: outcome.version,
    outcome: outcome._tag === "Cleared" ? ("cleared" as const) : ("no_eligible_quote" as const),
    reason: outcome._tag === "Cleared" ? null : outcome.reason,
    winner:
      outcome._tag === "Cleared"
        ? {
            provider: outcome.winner.provider_id,
            model: outcome.winner.model_class,
            own_ask: { price_in: outcome.winner.price_in, price_out: outcome.winner.price_out },
            clear: { price_in: outcome.clear.price_in, price_out: outcome.clear.price_out },
            price_setter: outcome.priceSetter,
            worst_case_charge: outcome.clearedCost,
            premium: outcome.premium,
            score_breakdown: outcome.winner.score_breakdown
          }
        : null,
    premium_cap_bps: outcome._tag === "Cleared" ? outcome.premiumCapBps : null,
    candidates: {
      considered: outcome.considered,
      eligible: outcome._tag === "Cleared" ? outcome.eligible : 0,
      excluded: outcome.excluded.length
    },
    data_maturity: maturity
  }
}

export const RoutingHandlers = HttpApiBuilder.group(
  Api,
  "routing",
  Effect.fn(function* (handlers) {
    const rfq = yield* Rfq
    return handlers.handle("preview", ({ payload }) =>
      Effect.gen(function* () {
        const promptTokens = estimatePromptTokens(payload.messages)
        const asSent = marketRequestOf(payload, promptTokens)
        const variants: Array<readonly [string, MarketRequest]> = [
          ...ROUTING_PROFILES.map((profile) => [profile, { ...asSent, requested: profile }] as const),
          ["as-sent", asSent],
          ["as-sent-without-latency-slo", { ...asSent, latencySlo: undefined }]
        ]
        const profiles = yield* Effect.forEach(variants, ([name, request]) =>
          Effect.map(rfq.run(request), (outcome) => previewOf(name, request, outcome))
        )
        return {
          object: "routing.preview" as const,
          prompt_tokens: promptTokens,
          max_tokens: asSent.maxTokens,
          profiles
        }
      })
    )
  })
)
