import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder, HttpApiSchema } from "effect/http-api"
import { ServiceUnavailable } from "../../domain/Errors.ts"
import { Analytics } from "../../marketdata/Analytics.ts"
import { Feedback } from "../../marketdata/Feedback.ts"
import { MarketData } from "../../marketdata/MarketData.ts"
import { MarketPage } from "../../marketdata/MarketPage.ts"
import { Drain } from "../../process/Drain.ts"
import { Api } from "../Api.ts"
import { MARKET_PAGE_POLICY } from "../MarketDataApi.ts"
import { renderError } from "../Middleware.ts"

/** Seconds a refused events subscriber is told to wait (it polls the snapshot meanwhile). */
export const EVENTS_RETRY_AFTER_SECONDS = 10

const json = (body: Uint8Array) => HttpServerResponse.uint8Array(body, { contentType: "application/json" })

export const MarketDataHandlers = HttpApiBuilder.group(
  Api,
  "marketData",
  Effect.fn(function* (handlers) {
    const market = yield* MarketData
    const drain = yield* Drain
    return (
      handlers
        .handle("snapshot", () => market.snapshot)
        // The series are served as bytes encoded once per grid and state of the window (D231).
        .handle("candles", ({ query }) => Effect.map(market.candlesBody(query), json))
        .handle("index", ({ query }) => Effect.map(market.indexBody(query), json))
        .handle("stats", () => market.stats)
        .handle("events", () =>
          Effect.map(market.subscribe, (stream) =>
            stream === undefined
              ? HttpServerResponse.setHeaders(
                  renderError(
                    "openai",
                    drain.isDraining()
                      ? new ServiceUnavailable({
                          code: "draining",
                          message: `This instance is shutting down; poll GET /v1/market/snapshot and retry the events in ${EVENTS_RETRY_AFTER_SECONDS} s (another instance will serve them)`
                        })
                      : new ServiceUnavailable({
                          code: "subscriber_capacity",
                          message: `The market events stream is at its subscriber capacity; poll GET /v1/market/snapshot and retry the events in ${EVENTS_RETRY_AFTER_SECONDS} s`
                        })
                  ),
                  { "retry-after": String(EVENTS_RETRY_AFTER_SECONDS) }
                )
              : HttpServerResponse.raw(stream, {
                  contentType: "text/event-stream",
                  headers: { "cache-control": "no-cache", "x-accel-buffering": "no" }
                })
          )
        )
    )
  })
)

export const MarketAnalyticsHandlers = HttpApiBuilder.group(
  Api,
  "marketAnalytics",
  Effect.fn(function* (handlers) {
    const analytics = yield* Analytics
    const feedback = yield* Feedback
    return handlers
      .handle("market", ({ query }) => analytics.market(query.window_ms))
      .handle("rollups", ({ query }) => analytics.rollups(query.window_ms, query.model_class))
      .handle("dashboard", ({ query }) => analytics.dashboard(query.window_ms, query.bucket_ms))
      .handle("leaderboard", ({ query }) => analytics.leaderboard(query.limit))
      .handle("provider", ({ params }) => analytics.provider(params.id))
      .handle("taskFit", () => feedback.taskFit)
  })
)

export const FeedbackHandlers = HttpApiBuilder.group(
  Api,
  "feedback",
  Effect.fn(function* (handlers) {
    const feedback = yield* Feedback
    return handlers.handle("rate", ({ params, payload, request }) =>
      feedback.rate(params.id, request.headers["x-stream-token"], payload)
    )
  })
)

export const MarketPageHandlers = HttpApiBuilder.group(
  Api,
  "marketPage",
  Effect.fn(function* (handlers) {
    const page = yield* MarketPage
    const html = Effect.succeed(
      HttpApiSchema.withHeaders({
        body: page.html,
        headers: { "content-security-policy": MARKET_PAGE_POLICY }
      })
    )
    return handlers
      .handle("page", () => html)
      .handle("root", () => html)
      .handle("script", () => Effect.succeed(page.script))
      .handle("charts", () => Effect.succeed(page.charts))
  })
)
