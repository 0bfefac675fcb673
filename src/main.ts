import { NodeRuntime } from "@effect/platform-node"
import { Layer } from "effect"
import { RouterLive } from "./Router.ts"
import { TelemetryLive } from "./Telemetry.ts"

Layer.launch(RouterLive.pipe(Layer.provide(TelemetryLive))).pipe(NodeRuntime.runMain)
