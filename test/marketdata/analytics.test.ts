import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { Analytics } from "../../src/marketdata/Analytics.ts"
import { call, routerLayer } from "../support/Router.ts"
import { ledgerClear } from "./support.ts"

const HOUR = 3_600_000
const DAY = 24 * HOUR

type Body = Record<string, unknown>
const json = (path: string) =>
  Effect.map(call(path), (r) => ({ status: r.status, body: r.json as Body, text: r.text }))

describe("analytics from the clearing records and the hourly rollups", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("market, rollups, dashboard, leaderboard and a provider, against hand-computed figures", () =>
      Effect.gen(function* () {
        const at = Date.now() - 10 * 60_000
        const spec = (
          providerId: string,
          modelClass: string,
          input: number,
          output: number,
          tariff: [number, number],
          ttftMs: number
        ) =>
          ledgerClear({
            at,
            modelClass,
            providerId,
            tokens: { input, output },
            tariff: { price_in: tariff[0], price_out: tariff[1] },
            ttftMs
          })
        yield* spec("prov-a", "chat-small", 1_000, 1_000, [1_000_000, 3_000_000], 100)
        yield* spec("prov-a", "chat-small", 2_000, 0, [500_000, 3_000_000], 200)
        yield* spec("prov-b", "chat-small", 0, 1_000, [1_000_000, 5_000_000], 300)
        yield* spec("prov-c", "chat-large", 100, 100, [2_000_000, 6_000_000], 50)

        const market = (yield* json("/v1/analytics/market")).body
        const small = (market.classes as Array<Body>).find((c) => c.model_class === "chat-small")
        // Σ numerators 10,000,000,000 over 5,000 tokens; provider volumes 5,000 and 5,000.
        assert.deepInclude(small, {
          count: 3,
          volume_tokens: 5_000,
          volume: 10_000,
          vwap: 2_000_000,
          high: 5_000_000,
          low: 500_000,
          ttft_avg_ms: 200,
          providers: 2,
          hhi: 5_000
        })
        // Whole market: 5,000, 5,000 and 800 of 10,800 → 2 × 46.296² + 7.407² = 4,341.6
        assert.strictEqual(market.hhi, 4_342)

        const rollups = (yield* json("/v1/analytics/rollups?model_class=chat-small")).body
        const hours = rollups.rollups as Array<Body>
        assert.strictEqual(
          hours.reduce((n, h) => n + (h.count as number), 0),
          3
        )
        for (const h of hours) assert.strictEqual((h.hour as number) % HOUR, 0)

        const dashboard = (yield* json("/v1/analytics/dashboard")).body
        assert.strictEqual(dashboard.bucket_ms, HOUR)
        assert.strictEqual((dashboard.buckets as Array<Body>).length, 168)
        assert.strictEqual(
          (dashboard.buckets as Array<Body>).reduce((n, b) => n + (b.count as number), 0),
          4
        )

        const board = (yield* json("/v1/analytics/leaderboard?limit=3")).body
        assert.deepStrictEqual(board.customers, [
          { rank: 1, spend: 5_000, requests: 1 },
          { rank: 2, spend: 4_000, requests: 1 },
          { rank: 3, spend: 1_000, requests: 1 }
        ])
        assert.deepStrictEqual(
          (board.providers as Array<Body>).map((p) => [p.rank, p.provider, p.volume, p.clears]),
          [
            [1, "prov-a", 5_000, 2],
            [2, "prov-b", 5_000, 1],
            [3, "prov-c", 800, 1]
          ]
        )

        const provider = (yield* json("/v1/analytics/providers/prov-a")).body
        assert.deepInclude(provider, {
          clears: 2,
          volume: 5_000,
          volume_tokens: 4_000,
          ttft_p50_ms: 100,
          ttft_p90_ms: 200
        })
        assert.closeTo(provider.win_share as number, 2 / 3, 1e-12)
        assert.strictEqual((yield* json("/v1/analytics/providers/nobody")).status, 404)
        assert.strictEqual((yield* json("/v1/analytics/leaderboard?limit=1000")).status, 400)
        assert.strictEqual((yield* json(`/v1/analytics/market?window_ms=${91 * DAY}`)).status, 400)
      })
    )

    it.effect("rollups older than 90 days disappear; younger ones stay", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const now = Date.now()
        const old = Math.floor((now - 91 * DAY) / HOUR) * HOUR
        const kept = Math.floor((now - 89 * DAY) / HOUR) * HOUR
        for (const hour of [old, kept]) {
          yield* sql`INSERT INTO market_rollups (hour_ms, model_class, provider_id, shard, clears, tokens, charge_num,
                       volume, high, low, ttft_sum)
                     VALUES (${hour}, 'chat-medium', 'prov-old', 0, 1, 10, 10000000, 10, 1000000, 1000000, 100)`
        }
        const analytics = yield* Analytics
        assert.strictEqual(yield* analytics.prune, 1)
        const left = yield* sql<{
          hour_ms: string
        }>`SELECT hour_ms::text FROM market_rollups WHERE provider_id = 'prov-old'`
        assert.deepStrictEqual(
          left.map((r) => Number(r.hour_ms)),
          [kept]
        )
        const rollups = (yield* json(`/v1/analytics/rollups?model_class=chat-medium&window_ms=${90 * DAY}`))
          .body
        assert.deepStrictEqual(
          (rollups.rollups as Array<Body>).map((r) => r.hour),
          [kept]
        )
      })
    )
  })
})
