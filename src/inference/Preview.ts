import { Context, Effect, Layer } from "effect"
import type { ChatCompletionRequest } from "../domain/Chat.ts"
import type { RoutingPreview as RoutingPreviewBody } from "../domain/Market.ts"
import { type AuctionOutcome, ROUTING_PROFILES } from "../market/Auction.ts"
import { type MarketRequest, Rfq } from "../market/Rfq.ts"
import { traced } from "../Telemetry.ts"
import { marketRequestOf } from "./Requirements.ts"
import { estimatePromptTokens } from "./Tokens.ts"

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

/**
 * `POST /v1/routing/preview`: the route, RFQ, award and clear steps of the lifecycle for every routing
 * profile and for the request as sent, without funding, reserving or serving anything. Every variant
 * keeps the request's task (`routing.task`), whose adjustment each winner's `score_breakdown.task_fit`
 * shows; `as-sent-without-task` is the request as sent scored without it.
 */
export class RoutingPreview extends Context.Service<
  RoutingPreview,
  { readonly preview: (request: ChatCompletionRequest) => Effect.Effect<RoutingPreviewBody> }
>()("router/inference/RoutingPreview") {
  static readonly layer = Layer.effect(
    RoutingPreview,
    Effect.gen(function* () {
      const rfq = yield* Rfq
      const preview = Effect.fnUntraced(function* (payload: ChatCompletionRequest) {
        const promptTokens = estimatePromptTokens(payload.messages)
        const asSent = marketRequestOf(payload, promptTokens)
        const variants: Array<readonly [string, MarketRequest]> = [
          ...ROUTING_PROFILES.map((profile) => [profile, { ...asSent, requested: profile }] as const),
          ["as-sent", asSent],
          ["as-sent-without-latency-slo", { ...asSent, latencySlo: undefined }],
          // The task's effect (D232): the same request scored on the catalog's quality alone.
          ...(asSent.task === undefined
            ? []
            : [["as-sent-without-task", { ...asSent, task: undefined }] as const])
        ]
        const profiles = yield* Effect.forEach(variants, ([name, request]) =>
          Effect.map(rfq.run(request), (outcome) => previewOf(name, request, outcome))
        )
        return {
          object: "routing.preview" as const,
          task: asSent.task ?? null,
          prompt_tokens: promptTokens,
          max_tokens: asSent.maxTokens,
          profiles
        }
      }, traced("RoutingPreview.preview"))
      return RoutingPreview.of({ preview })
    })
  )
}
