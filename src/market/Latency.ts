import { Clock, Context, Effect, Layer } from "effect"
import type { LatencyLookup } from "./Auction.ts"
import {
  defaultLatencyConfig,
  emptyLatencyState,
  type LatencyState,
  latencyEstimate,
  record
} from "./LatencyStats.ts"

/**
 * Per-instance decayed time-to-first-token statistics per (provider, class), fed by the
 * serve step. Kept in memory: they are an estimate that each instance learns from its own
 * traffic, not a record of money.
 */
export class Latency extends Context.Service<
  Latency,
  {
    readonly observe: (providerId: string, modelClass: string, ttftMs: number) => Effect.Effect<void>
    /** A lookup frozen at the current time, for one auction. */
    readonly lookup: Effect.Effect<LatencyLookup>
  }
>()("router/market/Latency") {
  static readonly layer = Layer.sync(Latency, () => {
    const states = new Map<string, LatencyState>()
    const key = (p: string, c: string) => `${p}\u0000${c}`
    return Latency.of({
      observe: (providerId, modelClass, ttftMs) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          const k = key(providerId, modelClass)
          states.set(k, record(states.get(k) ?? emptyLatencyState, ttftMs, now, defaultLatencyConfig))
        }),
      lookup: Effect.map(
        Clock.currentTimeMillis,
        (now): LatencyLookup =>
          (providerId, classId) =>
            latencyEstimate(
              states.get(key(providerId, classId)) ?? emptyLatencyState,
              now,
              defaultLatencyConfig
            )
      )
    })
  })
}
