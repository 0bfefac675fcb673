import { Clock, Context, Effect, Layer } from "effect"
import type { LatencyLookup } from "./Auction.ts"
import { defaultLatencyConfig, emptyLatencyState, LatencyEntry, record } from "./LatencyStats.ts"

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
    // Provider, then class: no key string is built per lookup (an auction looks up every live quote).
    // An entry keeps the observed quantiles asked of its state until the next observation replaces it.
    const states = new Map<string, Map<string, LatencyEntry>>()
    const never = new LatencyEntry(emptyLatencyState)
    return Latency.of({
      observe: (providerId, modelClass, ttftMs) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          let classes = states.get(providerId)
          if (classes === undefined) {
            classes = new Map()
            states.set(providerId, classes)
          }
          const previous = classes.get(modelClass)?.state ?? emptyLatencyState
          classes.set(
            modelClass,
            new LatencyEntry(record(previous, ttftMs, now, defaultLatencyConfig), defaultLatencyConfig)
          )
        }),
      lookup: Effect.map(
        Clock.currentTimeMillis,
        (now): LatencyLookup =>
          (providerId, classId) =>
            (states.get(providerId)?.get(classId) ?? never).estimate(now)
      )
    })
  })
}
