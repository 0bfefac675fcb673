import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder } from "effect/http-api"
import { KeyAnalytics } from "../../payment/KeyAnalytics.ts"
import { Api } from "../Api.ts"

export const KeyAnalyticsHandlers = HttpApiBuilder.group(
  Api,
  "keyAnalytics",
  Effect.fn(function* (handlers) {
    const analytics = yield* KeyAnalytics
    return handlers
      .handle("auctionsLatest", ({ query, request }) =>
        Effect.map(
          analytics.auctions(request.headers["x-credit-key"], query.view ?? "json", query.limit ?? 20),
          (reply) => (reply._tag === "Tape" ? HttpServerResponse.text(reply.text) : reply.view)
        )
      )
      .handle("bestex", ({ query, request }) =>
        analytics.bestex(request.headers["x-credit-key"], query.window_ms ?? 86_400_000)
      )
  })
)
