import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { PrometheusMetrics } from "effect/observability"
import { Chain } from "../../chain/Chain.ts"
import { NotReady } from "../../domain/System.ts"
import { Readiness } from "../../ledger/Readiness.ts"
import { Api } from "../Api.ts"
import { refreshProcessGauges } from "../Metrics.ts"
import { AUCTION_VERSION } from "../SystemApi.ts"

export const SystemHandlers = HttpApiBuilder.group(
  Api,
  "system",
  Effect.fn(function* (handlers) {
    const chain = yield* Chain
    const readiness = yield* Readiness
    return handlers
      .handle("health", () =>
        Effect.succeed({
          status: "ok" as const,
          network: chain.network,
          auction_version: AUCTION_VERSION,
          router_signer: chain.routerSigner
        })
      )
      .handle("ready", () =>
        Effect.flatMap(readiness.check, (body) =>
          body.status === "ready" ? Effect.succeed(body) : Effect.fail(new NotReady(body))
        )
      )
      .handle("metrics", () =>
        Effect.andThen(
          Effect.all([readiness.refreshGauges, refreshProcessGauges]),
          PrometheusMetrics.format()
        )
      )
  })
)
