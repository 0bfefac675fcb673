import { Layer } from "effect"
import { RouterLive } from "./Router.ts"
import { runRouter } from "./Shutdown.ts"
import { TelemetryLive } from "./Telemetry.ts"

runRouter(RouterLive.pipe(Layer.provide(TelemetryLive)))
