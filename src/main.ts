import cluster from "node:cluster"
import { Layer } from "effect"
import { runCluster, workersFromEnv } from "./Cluster.ts"
import { RouterLive } from "./Router.ts"
import { runRouter } from "./Shutdown.ts"
import { TelemetryLive } from "./Telemetry.ts"

// `WORKERS=N`: this process is the primary of N router processes on one port (src/Cluster.ts); each
// worker, and a router of one process, runs the whole router.
const workers = workersFromEnv()
if (workers > 1 && cluster.isPrimary) runCluster(workers)
else runRouter(RouterLive.pipe(Layer.provide(TelemetryLive)))
