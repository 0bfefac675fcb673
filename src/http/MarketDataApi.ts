import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "effect/http-api"
import { InvalidRequest, ServiceUnavailable } from "../domain/Errors.ts"
import { Candles, MarketIndex, MarketSnapshot, MarketStats } from "../domain/MarketData.ts"
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
    "OHLC and token-weighted VWAP of the blended cleared price per bucket. `window_ms` at most 86,400,000 (refused above); `bucket_ms` clamped to at least 1,000 and to at most 1,440 points."
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
