import { Clock, Context, Effect, Layer } from "effect"
import type { LatencyLookup } from "./Auction.ts"
import { defaultLatencyConfig, emptyLatencyState, LatencyEntry, record } from "./LatencyStats.ts"
import { knownProviderNumber, providerNumber } from "./ProviderNumbers.ts"

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
    // Provider (by its process-wide number, D304), then class: no key string is built per lookup, and an
    // auction, which hands each quote's provider number, reads the provider by index.
    // An entry keeps the observed quantiles asked of its state until the next observation replaces it.
    const states: Array<Map<string, LatencyEntry> | undefined> = []
    const never = new LatencyEntry(emptyLatencyState)
    return Latency.of({
      observe: (providerId, modelClass, ttftMs) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          const number = providerNumber(providerId)
          let classes = states[number]
          if (classes === undefined) {
            classes = new Map()
            states[number] = classes
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
          (providerId, classId, provider = knownProviderNumber(providerId)) =>
            ((provider === undefined ? undefined : states[provider])?.get(classId) ?? never).estimate(now)
      )
    })
  })
}
