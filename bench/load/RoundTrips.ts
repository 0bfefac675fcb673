/**
 * What one Postgres round trip costs on this machine at a given rate: `SELECT 1`, evenly spaced, from the
 * bench's process over the transport the router uses (`embeddedDatabaseUrl`: its embedded server's
 * Unix-domain socket when there is one). A credit-key call waits for one round trip before anything is served (its reservation), which a
 * free gateway never makes; on a machine whose cores sleep between calls each round trip also pays for
 * waking them, so its cost at 100 calls a second says how much of the router's added latency there is
 * the machine's (issue 12). Asserts nothing.
 */
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"

export interface RoundTrips {
  readonly perSecond: number
  readonly count: number
  readonly p50: number
  readonly p99: number
}

const quantile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))] ?? Number.NaN

/** `perSecond` round trips a second for `seconds` on one connection (after 100 unmeasured ones). */
export const postgresRoundTrips = (url: string, perSecond: number, seconds: number) =>
  Effect.gen(function* () {
    const sql = yield* PgClient.PgClient
    for (let i = 0; i < 100; i++) yield* sql`SELECT 1`
    const count = Math.round(perSecond * seconds)
    const interval = 1000 / perSecond
    const took: Array<number> = []
    const started = performance.now()
    for (let i = 0; i < count; i++) {
      const wait = started + i * interval - performance.now()
      if (wait > 0) yield* Effect.sleep(wait)
      const sent = performance.now()
      yield* sql`SELECT 1`
      took.push(performance.now() - sent)
    }
    took.sort((a, b) => a - b)
    return { perSecond, count, p50: quantile(took, 0.5), p99: quantile(took, 0.99) } satisfies RoundTrips
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })), Effect.runPromise)
