import { NodeRuntime } from "@effect/platform-node"
import { Config, Effect, Layer } from "effect"
import { Fleet } from "./fleet/Fleet.ts"

/** `npm run providers`: the simulated provider fleet on its own, against a running router. */
const FleetFromConfig = Layer.unwrap(
  Effect.gen(function* () {
    const routerUrl = yield* Config.String("ROUTER_URL").pipe(Config.withDefault("http://127.0.0.1:8402"))
    const operatorToken = yield* Config.Redacted("OPERATOR_TOKEN")
    return Fleet.layer({ routerUrl, operatorToken })
  })
)

NodeRuntime.runMain(Layer.launch(FleetFromConfig))
