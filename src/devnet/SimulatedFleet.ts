import { Config, Effect, Layer } from "effect"
import { RouterConfig } from "../RouterConfig.ts"

/**
 * The simulated fleet, serving this router, unless `SIMULATED_FLEET=false` (real upstreams register
 * themselves); its modules load only when it runs (D340). Started once the router listens: after the
 * HTTP server in one process (`Router.ts`), by the primary once every worker listens (`Cluster.ts`).
 */
export const SimulatedFleetLive = Layer.unwrap(
  Effect.gen(function* () {
    if (!(yield* Config.Boolean("SIMULATED_FLEET").pipe(Config.withDefault(true)))) return Layer.empty
    const config = yield* RouterConfig
    const { Fleet } = yield* Effect.promise(() => import("./fleet/Fleet.ts"))
    const fleet = Fleet.layer({
      routerUrl: `http://127.0.0.1:${config.port}`,
      operatorToken: config.operatorToken
    })
    return Layer.effectDiscard(Effect.void).pipe(Layer.provide(fleet))
  })
)
