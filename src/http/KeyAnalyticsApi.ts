import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
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
    // JSON for `replay`, `tree`, `json`; `tape` is plain text, one compact line per auction.
    success: Schema.Unknown,
    error: [openAi(Unauthorized), openAi(Forbidden)]
  }),
  HttpApiEndpoint.get("bestex", "/v1/keys/bestex", {
    query: {
      window_ms: Schema.optional(
        Schema.NumberFromString.check(
          Schema.isInt(),
          Schema.isBetween({ minimum: 60_000, maximum: 90 * 86_400_000 })
        )
      )
    },
    success: Schema.Unknown,
    error: [openAi(Unauthorized), openAi(Forbidden)]
  })
) {}
