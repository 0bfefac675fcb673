import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { repeatInBackground } from "../Background.ts"
import { InvalidRequest, NotFound } from "../domain/Errors.ts"
import type {
  AnalyticsMarket,
  Dashboard,
  MarketLeaderboard,
  ProviderAnalytics,
  Rollups
} from "../domain/MarketData.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"
import { MarketData, STATS_WINDOW_MS } from "./MarketData.ts"
import { hhi, PRICE_UNIT, roundDiv } from "./Series.ts"

const HOUR_MS = 3_600_000
/** Rollups are kept 90 days (spec 8); no analytics window reaches further. */
export const ROLLUP_RETENTION_MS = 90 * 24 * HOUR_MS
/** The dashboard's most points; its buckets are whole hours. */
const DASHBOARD_MAX_POINTS = 500
const LEADERBOARD_WINDOW_MS = 30 * 24 * HOUR_MS
export const LEADERBOARD_MAX_LIMIT = 100

interface RollupRow {
  readonly hour_ms: string
  readonly model_class: string
  readonly provider_id: string
  readonly clears: string
  readonly tokens: string
  readonly charge_num: string
  readonly volume: string
  readonly high: string
  readonly low: string
  readonly ttft_sum: string
}

interface Figures {
  count: number
  tokens: number
  num: bigint
  volume: number
  high: number | null
  low: number | null
  ttftSum: number
}

const emptyFigures = (): Figures => ({
  count: 0,
  tokens: 0,
  num: 0n,
  volume: 0,
  high: null,
  low: null,
  ttftSum: 0
})

const addRow = (f: Figures, r: RollupRow) => {
  f.count += Number(r.clears)
  f.volume += Number(r.volume)
  f.ttftSum += Number(r.ttft_sum)
  const tokens = Number(r.tokens)
  if (tokens === 0) return
  f.tokens += tokens
  f.num += BigInt(r.charge_num.split(".")[0]!)
  f.high = f.high === null ? Number(r.high) : Math.max(f.high, Number(r.high))
  f.low = f.low === null ? Number(r.low) : Math.min(f.low, Number(r.low))
}

const figuresOut = (f: Figures) => ({
  count: f.count,
  volume_tokens: f.tokens,
  volume: f.volume,
  vwap: f.tokens > 0 ? roundDiv(f.num, BigInt(f.tokens)) : null,
  high: f.high,
  low: f.low,
  ttft_avg_ms: f.count > 0 ? Math.round(f.ttftSum / f.count) : null
})

/**
 * The analytics of spec 4.4 (docs/decisions.md D126–D129), all from the clearing records: the hourly
 * rollups the trigger keeps (never a scan of history per request), the clears of the last 24 h held by
 * `MarketData`, and for a provider's reliability the request rows of the last 24 h.
 */
export class Analytics extends Context.Service<
  Analytics,
  {
    readonly market: (windowMs: number | undefined) => Effect.Effect<AnalyticsMarket, InvalidRequest>
    readonly rollups: (
      windowMs: number | undefined,
      modelClass: string | undefined
    ) => Effect.Effect<Rollups, InvalidRequest>
    readonly dashboard: (
      windowMs: number | undefined,
      bucketMs: number | undefined
    ) => Effect.Effect<Dashboard, InvalidRequest>
    readonly leaderboard: (limit: number | undefined) => Effect.Effect<MarketLeaderboard, InvalidRequest>
    readonly provider: (id: string) => Effect.Effect<ProviderAnalytics, NotFound>
    /**
     * Deletes rollups older than 90 days (returns how many hours of rows went) and wallet hours before the
     * leaderboard's window.
     */
    readonly prune: Effect.Effect<number>
  }
>()("router/marketdata/Analytics") {
  static readonly layer = Layer.effect(
    Analytics,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const market = yield* MarketData
      const providers = yield* Providers
      const quoteBook = yield* QuoteBook

      const windowOf = (windowMs: number | undefined, fallback: number) => {
        const w = windowMs ?? fallback
        return Number.isSafeInteger(w) && w > 0 && w <= ROLLUP_RETENTION_MS
          ? Effect.succeed(w)
          : Effect.fail(
              new InvalidRequest({
                code: "invalid_range",
                param: "window_ms",
                message: `window_ms must be an integer in 1..${ROLLUP_RETENTION_MS} (90 days of hourly rollups; got ${windowMs})`
              })
            )
      }

      const rowsSince = (from: number) =>
        sql<RollupRow>`
          SELECT hour_ms::text, model_class, provider_id, sum(clears)::text AS clears, sum(tokens)::text AS tokens,
                 sum(charge_num)::text AS charge_num, sum(volume)::text AS volume, max(high)::text AS high,
                 min(low)::text AS low, sum(ttft_sum)::text AS ttft_sum
          FROM market_rollups WHERE hour_ms >= ${from}
          GROUP BY hour_ms, model_class, provider_id
          ORDER BY hour_ms, model_class, provider_id
        `.pipe(Effect.orDie)

      /** The window as whole hours: from the start of the hour holding `now - window`. */
      const hourFrom = (now: number, windowMs: number) => Math.floor((now - windowMs) / HOUR_MS) * HOUR_MS

      const marketOf = Effect.fn("Analytics.market")(function* (windowMs: number | undefined) {
        const window = yield* windowOf(windowMs, STATS_WINDOW_MS)
        const from = hourFrom(yield* Clock.currentTimeMillis, window)
        const rows = yield* rowsSince(from)
        const classes = new Map<string, { figures: Figures; providers: Map<string, number> }>()
        const byProvider = new Map<string, number>()
        for (const r of rows) {
          const entry = classes.get(r.model_class) ?? { figures: emptyFigures(), providers: new Map() }
          classes.set(r.model_class, entry)
          addRow(entry.figures, r)
          entry.providers.set(r.provider_id, (entry.providers.get(r.provider_id) ?? 0) + Number(r.volume))
          byProvider.set(r.provider_id, (byProvider.get(r.provider_id) ?? 0) + Number(r.volume))
        }
        return {
          object: "analytics.market" as const,
          unit: PRICE_UNIT,
          window_ms: window,
          from,
          hhi: hhi([...byProvider.values()]),
          classes: [...classes.entries()]
            .sort(([a], [b]) => a.localeCompare(b))
            .map(([modelClass, { figures, providers: shares }]) => ({
              model_class: modelClass,
              ...figuresOut(figures),
              providers: shares.size,
              hhi: hhi([...shares.values()])
            }))
        }
      })

      const rollupsOf = Effect.fn("Analytics.rollups")(function* (
        windowMs: number | undefined,
        modelClass: string | undefined
      ) {
        const window = yield* windowOf(windowMs, STATS_WINDOW_MS)
        const from = hourFrom(yield* Clock.currentTimeMillis, window)
        const rows = yield* rowsSince(from)
        const hours = new Map<string, { hour: number; modelClass: string; figures: Figures }>()
        for (const r of rows) {
          if (modelClass !== undefined && r.model_class !== modelClass) continue
          const key = `${r.hour_ms}/${r.model_class}`
          const entry = hours.get(key) ?? {
            hour: Number(r.hour_ms),
            modelClass: r.model_class,
            figures: emptyFigures()
          }
          hours.set(key, entry)
          addRow(entry.figures, r)
        }
        return {
          object: "analytics.rollups" as const,
          unit: PRICE_UNIT,
          window_ms: window,
          from,
          rollups: [...hours.values()].map((h) => ({
            hour: h.hour,
            model_class: h.modelClass,
            ...figuresOut(h.figures)
          }))
        }
      })

      const dashboardOf = Effect.fn("Analytics.dashboard")(function* (
        windowMs: number | undefined,
        bucketMs: number | undefined
      ) {
        const window = yield* windowOf(windowMs, 7 * 24 * HOUR_MS)
        if (bucketMs !== undefined && (!Number.isSafeInteger(bucketMs) || bucketMs <= 0)) {
          return yield* new InvalidRequest({
            code: "invalid_range",
            param: "bucket_ms",
            message: `bucket_ms must be a positive integer (got ${bucketMs})`
          })
        }
        // Whole hours (the rollups' grain), at most 500 points.
        const floor = Math.max(HOUR_MS, Math.ceil(window / DASHBOARD_MAX_POINTS / HOUR_MS) * HOUR_MS)
        const bucket = Math.max(floor, Math.round((bucketMs ?? floor) / HOUR_MS) * HOUR_MS)
        const now = yield* Clock.currentTimeMillis
        const to = (Math.floor(now / bucket) + 1) * bucket
        const points = Math.ceil(window / bucket)
        const from = to - points * bucket
        const buckets = Array.from({ length: points }, emptyFigures)
        for (const r of yield* rowsSince(from)) {
          const i = Math.floor((Number(r.hour_ms) - from) / bucket)
          if (i >= 0 && i < points) addRow(buckets[i]!, r)
        }
        return {
          object: "analytics.dashboard" as const,
          unit: PRICE_UNIT,
          window_ms: window,
          bucket_ms: bucket,
          from,
          to,
          buckets: buckets.map((f, i) => {
            const out = figuresOut(f)
            return {
              t: from + i * bucket,
              count: out.count,
              volume_tokens: out.volume_tokens,
              volume: out.volume,
              vwap: out.vwap,
              ttft_avg_ms: out.ttft_avg_ms
            }
          })
        }
      })

      const leaderboardOf = Effect.fn("Analytics.leaderboard")(function* (limit: number | undefined) {
        const n = limit ?? 10
        if (!Number.isSafeInteger(n) || n < 1 || n > LEADERBOARD_MAX_LIMIT) {
          return yield* new InvalidRequest({
            code: "invalid_range",
            param: "limit",
            message: `limit must be an integer in 1..${LEADERBOARD_MAX_LIMIT} (got ${limit})`
          })
        }
        // Whole hours, customers and providers alike: from the start of the hour holding `now - 30 days`. The
        // customers' spend is summed from their hourly rows, not from every clear of the window (D559).
        const from = hourFrom(yield* Clock.currentTimeMillis, LEADERBOARD_WINDOW_MS)
        const customers = yield* sql<{ spend: string; requests: string }>`
          SELECT sum(spend)::text AS spend, sum(requests)::text AS requests
          FROM market_wallet_hours WHERE hour_ms >= ${from}
          GROUP BY wallet ORDER BY sum(spend) DESC, sum(requests) DESC, wallet LIMIT ${n}
        `.pipe(Effect.orDie)
        const rows = yield* rowsSince(from)
        const byProvider = new Map<string, Figures>()
        for (const r of rows) {
          const f = byProvider.get(r.provider_id) ?? emptyFigures()
          byProvider.set(r.provider_id, f)
          addRow(f, r)
        }
        const total = [...byProvider.values()].reduce((s, f) => s + f.volume, 0)
        const ranked = [...byProvider.entries()].sort(
          ([a, x], [b, y]) => y.volume - x.volume || y.tokens - x.tokens || a.localeCompare(b)
        )
        return {
          object: "analytics.leaderboard" as const,
          window_ms: LEADERBOARD_WINDOW_MS,
          customers: customers.map((c, i) => ({
            rank: i + 1,
            spend: Number(c.spend),
            requests: Number(c.requests)
          })),
          providers: ranked.slice(0, n).map(([provider, f], i) => ({
            rank: i + 1,
            provider,
            volume: f.volume,
            volume_tokens: f.tokens,
            clears: f.count,
            share: total > 0 ? f.volume / total : 0
          }))
        }
      })

      const providerOf = Effect.fn("Analytics.provider")(function* (id: string) {
        if (providers.get(id) === undefined) {
          // One index probe: a provider no longer registered is known by any clear of its (D559).
          const known = yield* sql<{ known: boolean }>`
            SELECT EXISTS (SELECT 1 FROM market_clears WHERE provider_id = ${id}) AS known`.pipe(Effect.orDie)
          if (known[0]?.known !== true) {
            return yield* new NotFound({ code: "provider_not_found", message: `Unknown provider ${id}` })
          }
        }
        const now = yield* Clock.currentTimeMillis
        const held = yield* market.window
        held.roll(now)
        const own = held.provider(id)
        // Every clear of the classes it cleared in, over the same whole minutes of the stats window.
        const inClasses = own === undefined ? 0 : held.stats(own.classes).reduce((n, c) => n + c.count, 0)
        const ttft = (q: number) => own?.ttftQuantile(q) ?? null
        const outcomes = yield* sql<{ status: string; n: string; failovers: string }>`
          SELECT r.status, count(*)::text AS n,
                 count(*) FILTER (WHERE rc.body->>'provider_id' IS DISTINCT FROM r.provider_id)::text AS failovers
          FROM requests r LEFT JOIN receipts rc ON rc.request_id = r.request_id
          WHERE r.provider_id = ${id} AND r.created_at >= to_timestamp(${(now - STATS_WINDOW_MS) / 1000})
                AND r.status <> 'reserved'
          GROUP BY r.status
        `.pipe(Effect.orDie)
        const partial = yield* sql<{ n: string }>`
          SELECT count(*)::text AS n FROM market_clears c JOIN receipts rc ON rc.request_id = c.request_id
          WHERE c.provider_id = ${id} AND c.at_ms >= ${now - STATS_WINDOW_MS} AND rc.body->>'status' = 'partial'
        `.pipe(Effect.orDie)
        const count = (status: string) => Number(outcomes.find((o) => o.status === status)?.n ?? 0)
        const requests = count("captured") + count("released")
        const released = count("released")
        const partialCount = Number(partial[0]?.n ?? 0)
        const live = yield* quoteBook.live
        return {
          object: "analytics.provider" as const,
          provider: id,
          window_ms: STATS_WINDOW_MS,
          clears: own?.clears ?? 0,
          volume: own?.volume ?? 0,
          volume_tokens: own?.tokens ?? 0,
          win_share: own !== undefined && inClasses > 0 ? own.clears / inClasses : null,
          requests,
          released,
          partial: partialCount,
          failovers: outcomes.reduce((s, o) => s + Number(o.failovers), 0),
          error_rate: requests > 0 ? (released + partialCount) / requests : null,
          ttft_p50_ms: ttft(0.5),
          ttft_p90_ms: ttft(0.9),
          ttft_p99_ms: ttft(0.99),
          quotes: live
            .filter((q) => q.quote.provider_id === id)
            .map(({ quote }) => ({
              model_class: quote.model_class,
              price_in: quote.price_in,
              price_out: quote.price_out,
              capacity_rps: quote.capacity_rps,
              valid_until: quote.valid_until
            }))
        }
      })

      const prune = Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const cut = now - ROLLUP_RETENTION_MS
        const rows = yield* sql<{ n: string }>`
          WITH gone AS (DELETE FROM market_rollups WHERE hour_ms < ${cut} RETURNING hour_ms)
          SELECT count(DISTINCT hour_ms)::text AS n FROM gone
        `.pipe(Effect.orDie)
        // A wallet's hours serve the leaderboard's window only: those before its first hour go (D559).
        yield* sql`DELETE FROM market_wallet_hours WHERE hour_ms < ${hourFrom(now, LEADERBOARD_WINDOW_MS)}`.pipe(
          Effect.orDie
        )
        return Number(rows[0]?.n ?? 0)
      }).pipe(Effect.withSpan("Analytics.prune"))

      yield* repeatInBackground(prune, {
        every: "1 hour",
        failure: "analytics: rollup retention failed",
        level: "warning"
      })

      return Analytics.of({
        market: marketOf,
        rollups: rollupsOf,
        dashboard: dashboardOf,
        leaderboard: leaderboardOf,
        provider: providerOf,
        prune
      })
    })
  )
}
