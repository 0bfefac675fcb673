import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "effect/http-api"
import { Conflict, InvalidRequest, NotFound, ServiceUnavailable, Unauthorized } from "../domain/Errors.ts"
import {
  AnalyticsMarket,
  Candles,
  Dashboard,
  FeedbackRecorded,
  FeedbackRequest,
  MarketIndex,
  MarketLeaderboard,
  MarketSnapshot,
  MarketStats,
  ProviderAnalytics,
  Rollups,
  TaskFit
} from "../domain/MarketData.ts"
import { openAi } from "./ErrorWire.ts"

const Millis = Schema.optional(Schema.NumberFromString)

/** Public market data (spec 4.4): no credential, nothing of a customer, a prompt or a reply. */
export class MarketDataApi extends HttpApiGroup.make("marketData").add(
  HttpApiEndpoint.get("snapshot", "/v1/market/snapshot", { success: MarketSnapshot }).annotate(
    OpenApi.Description,
    "Models, book and economics (last clears, index, 24 h stats) in one response, with `as_of` and a `sequence` that only grows."
  ),
  HttpApiEndpoint.get("candles", "/v1/market/candles", {
    query: { model_class: Schema.optional(Schema.String), window_ms: Millis, bucket_ms: Millis },
    success: Candles,
    error: openAi(InvalidRequest)
  }).annotate(
    OpenApi.Description,
    "OHLC and token-weighted VWAP of the blended cleared price per bucket. `window_ms` at most 86,400,000 (refused above); `bucket_ms` clamped to at least 1,000 and to at most 1,440 points, and to whole minutes when a minute or more or when the window is over 1 h, else to whole seconds."
  ),
  HttpApiEndpoint.get("index", "/v1/market/index", {
    query: { classes: Schema.optional(Schema.String), window_ms: Millis, bucket_ms: Millis },
    success: MarketIndex,
    error: openAi(InvalidRequest)
  }).annotate(
    OpenApi.Description,
    "Token-weighted composite of the basket's VWAPs with its component weights (summing to 1); `classes` omitted is the whole market. Bounds as candles."
  ),
  HttpApiEndpoint.get("stats", "/v1/market/stats", { success: MarketStats }).annotate(
    OpenApi.Description,
    "Rolling 24 h clearing summary per class: count, volume, VWAP, high, low, change, TTFT p50/p90."
  ),
  HttpApiEndpoint.get("events", "/v1/market/events", {
    success: Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/event-stream" })),
    error: openAi(ServiceUnavailable)
  }).annotate(
    OpenApi.Description,
    "`text/event-stream`: each `data:` frame is a MarketSnapshot (the snapshot's schema), pushed on a clear or a quote in or out, with `: heartbeat` comments between. At subscriber capacity: 503 with `Retry-After`; poll `/v1/market/snapshot` instead."
  )
) {}

const Window = { window_ms: Millis }

/** Public analytics (spec 4.4), from the clearing records and the hourly rollups. */
export class MarketAnalyticsApi extends HttpApiGroup.make("marketAnalytics").add(
  HttpApiEndpoint.get("market", "/v1/analytics/market", {
    query: Window,
    success: AnalyticsMarket,
    error: openAi(InvalidRequest)
  }).annotate(
    OpenApi.Description,
    "Per-class cleared prices, HHI of provider shares of cleared volume, latency; `window_ms` ≤ 90 days (default 24 h), whole hours."
  ),
  HttpApiEndpoint.get("rollups", "/v1/analytics/rollups", {
    query: { ...Window, model_class: Schema.optional(Schema.String) },
    success: Rollups,
    error: openAi(InvalidRequest)
  }).annotate(OpenApi.Description, "Hourly aggregates per class, kept 90 days, maintained as clears commit."),
  HttpApiEndpoint.get("dashboard", "/v1/analytics/dashboard", {
    query: { ...Window, bucket_ms: Millis },
    success: Dashboard,
    error: openAi(InvalidRequest)
  }).annotate(
    OpenApi.Description,
    "The whole market per bucket (whole hours, at most 500 points; default 7 days)."
  ),
  HttpApiEndpoint.get("leaderboard", "/v1/analytics/leaderboard", {
    query: { limit: Schema.optional(Schema.NumberFromString) },
    success: MarketLeaderboard,
    error: openAi(InvalidRequest)
  }).annotate(
    OpenApi.Description,
    "Customers by spend over 30 days, by rank only (no wallet or label); providers by cleared volume. `limit` 1..100, default 10."
  ),
  HttpApiEndpoint.get("provider", "/v1/analytics/providers/:id", {
    params: { id: Schema.String },
    success: ProviderAnalytics,
    error: openAi(NotFound)
  }),
  HttpApiEndpoint.get("taskFit", "/v1/analytics/task-fit", { success: TaskFit })
) {}

export class FeedbackApi extends HttpApiGroup.make("feedback").add(
  HttpApiEndpoint.post("rate", "/v1/routing/feedback/:id", {
    params: { id: Schema.String },
    payload: FeedbackRequest,
    success: FeedbackRecorded,
    error: [openAi(InvalidRequest), openAi(Unauthorized), openAi(NotFound), openAi(Conflict)]
  }).annotate(
    OpenApi.Description,
    "One rating (1..5, optional `task`) of a served request, with its `x-stream-token`, while the serving instance holds its stream (10 minutes, less once newer replies fill `STREAM_REPLAY_MB`); a second rating is 409 `feedback_already_recorded`."
  )
) {}

/** The page may run only the router's scripts and talk only to the router. */
export const MARKET_PAGE_POLICY =
  "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; " +
  "frame-ancestors 'none'; base-uri 'none'"

const Script = Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/javascript; charset=utf-8" }))

/** The live market page at `/market` (and `/`), its script and the charting library it uses. */
export class MarketPageApi extends HttpApiGroup.make("marketPage").add(
  HttpApiEndpoint.get("page", "/market", {
    success: HttpApiSchema.WithHeaders(
      Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/html; charset=utf-8" })),
      { "content-security-policy": Schema.Literal(MARKET_PAGE_POLICY) }
    )
  }),
  HttpApiEndpoint.get("root", "/", {
    success: HttpApiSchema.WithHeaders(
      Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/html; charset=utf-8" })),
      { "content-security-policy": Schema.Literal(MARKET_PAGE_POLICY) }
    )
  }),
  HttpApiEndpoint.get("script", "/market/market.js", { success: Script }),
  HttpApiEndpoint.get("charts", "/market/lightweight-charts.js", { success: Script })
) {}
