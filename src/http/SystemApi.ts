import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { Health, NotReady, Readiness } from "../domain/System.ts"
import { MECHANISM_VERSION } from "../market/Auction.ts"

/** The mechanism version every reply names in `x-svc-auction-version`. */
export const AUCTION_VERSION = MECHANISM_VERSION

export class SystemApi extends HttpApiGroup.make("system", { topLevel: true }).add(
  HttpApiEndpoint.get("health", "/health", { success: Health }),
  HttpApiEndpoint.get("ready", "/ready", { success: Readiness, error: NotReady }),
  HttpApiEndpoint.get("metrics", "/metrics", {
    success: Schema.String.pipe(
      HttpApiSchema.asText({ contentType: "text/plain; version=0.0.4; charset=utf-8" })
    )
  })
) {}
