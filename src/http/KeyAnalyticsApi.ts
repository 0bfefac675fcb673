import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "effect/http-api"
import { AuctionsView, Bestex } from "../domain/Analytics.ts"
import { Forbidden, Unauthorized } from "../domain/Errors.ts"
import { openAi } from "./ErrorWire.ts"

/** Key-scoped reads: they make no model call and change nothing. */
export class KeyAnalyticsApi extends HttpApiGroup.make("keyAnalytics").add(
  HttpApiEndpoint.get("auctionsLatest", "/v1/auctions/latest", {
    query: {
      view: Schema.optional(Schema.Literals(["tape", "replay", "tree", "json"])),
      limit: Schema.optional(
        Schema.NumberFromString.check(Schema.isInt(), Schema.isBetween({ minimum: 1, maximum: 200 }))
      )
    },
    success: [AuctionsView, Schema.String.pipe(HttpApiSchema.asText())],
    error: [openAi(Unauthorized), openAi(Forbidden)]
  }).annotate(
    OpenApi.Description,
    "JSON for `view=json` (default), `replay` and `tree`; `view=tape` is `text/plain`, one compact line per auction."
  ),
  HttpApiEndpoint.get("bestex", "/v1/keys/bestex", {
    query: {
      window_ms: Schema.optional(
        Schema.NumberFromString.check(
          Schema.isInt(),
          Schema.isBetween({ minimum: 60_000, maximum: 90 * 86_400_000 })
        )
      )
    },
    success: Bestex,
    error: [openAi(Unauthorized), openAi(Forbidden)]
  })
) {}
