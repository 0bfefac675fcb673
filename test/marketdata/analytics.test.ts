import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { WALLET_HOURS_OF_CLEARS } from "../../src/db/migrations/walletHours.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Analytics } from "../../src/marketdata/Analytics.ts"
import { fundedKey } from "../support/Keys.ts"
import { call, routerLayer } from "../support/Router.ts"
import { type ClearSpec, ledgerClear, reservedClear } from "./support.ts"

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

    // D559: the customer leaderboard sums each wallet's hourly rows, written by the settling statements, not
    // 30 days of clears per call.
    it.effect(
      "a wallet's hourly spend is the sum of its clears, and the leaderboard's window is whole hours",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const ledger = yield* Ledger
          const now = Date.now()
          const big = { price_in: 900_000_000, price_out: 900_000_000 }
          const spec = (at: number, released = false): ClearSpec => ({
            at,
            modelClass: "chat-small",
            providerId: "prov-w",
            tokens: { input: 1_000, output: 1_000 },
            tariff: big,
            ttftMs: 10,
            released
          })
          const one = yield* fundedKey({ budget: 10 ** 15, balance: 10 ** 15 })
          const two = yield* fundedKey({ budget: 10 ** 15, balance: 10 ** 15 })
          const settle = (s: ClearSpec, key: typeof one) =>
            Effect.flatMap(reservedClear(s, key), ({ record }) =>
              s.released ? ledger.release(record) : ledger.capture(record)
            )
          // Together, so some settle in one statement (a batch with the same wallet and hour twice).
          yield* Effect.all(
            [
              settle(spec(now - 10 * 60_000), one),
              settle(spec(now - 9 * 60_000), one),
              settle(spec(now - 8 * 60_000), two),
              settle(spec(now - 7 * 60_000, true), two),
              settle(spec(now - 2 * HOUR), one)
            ],
            { concurrency: "unbounded" }
          )
          const byHour = (
            rows: ReadonlyArray<{ hour_ms: string; wallet: string; spend: string; requests: string }>
          ) => rows.map((r) => `${r.hour_ms} ${r.wallet} ${r.spend} ${r.requests}`)
          const wallets = [one.wallet, two.wallet]
          const kept = yield* sql<{ hour_ms: string; wallet: string; spend: string; requests: string }>`
          SELECT hour_ms::text, wallet, spend::text, requests::text FROM market_wallet_hours
          WHERE wallet IN ${sql.in(wallets)} ORDER BY hour_ms, wallet`
          const summed = yield* sql<{ hour_ms: string; wallet: string; spend: string; requests: string }>`
          SELECT (at_ms - at_ms % 3600000)::text AS hour_ms, wallet, sum(charged)::text AS spend,
                 count(*)::text AS requests
          FROM market_clears WHERE wallet IN ${sql.in(wallets)} GROUP BY 1, 2 ORDER BY 1, 2`
          assert.deepStrictEqual(byHour(kept), byHour(summed))
          // 1,800,000 each: `one` cleared three times (two in one hour), `two` once (its release cleared nothing).
          assert.deepStrictEqual(
            kept.reduce((n, r) => n + Number(r.requests), 0),
            4
          )
          const board = (yield* json("/v1/analytics/leaderboard?limit=2")).body
          assert.deepStrictEqual(board.customers, [
            { rank: 1, spend: 5_400_000, requests: 3 },
            { rank: 2, spend: 1_800_000, requests: 1 }
          ])

          // The window starts at the hour holding `now - 30 days`: an hour before it counts for nothing, and the
          // retention pass deletes it; that hour itself counts. (Not within seconds of an hour's end, so the
          // router's window starts at the same hour as the one computed here.)
          const untilNextHour = HOUR - ((Date.now() - 30 * DAY) % HOUR)
          if (untilNextHour < 10_000) yield* Effect.sleep(untilNextHour + 100)
          const first = Math.floor((Date.now() - 30 * DAY) / HOUR) * HOUR
          yield* sql`INSERT INTO market_wallet_hours (hour_ms, wallet, spend, requests)
                   VALUES (${first - HOUR}, '0xbefore', 10000000, 1), (${first}, '0xfirst', 9000000, 2)`
          const windowed = (yield* json("/v1/analytics/leaderboard?limit=2")).body
          assert.deepStrictEqual(windowed.customers, [
            { rank: 1, spend: 9_000_000, requests: 2 },
            { rank: 2, spend: 5_400_000, requests: 3 }
          ])
          yield* (yield* Analytics).prune
          const left = yield* sql<{ wallet: string }>`
          SELECT wallet FROM market_wallet_hours WHERE wallet IN ('0xbefore', '0xfirst')`
          assert.deepStrictEqual(
            left.map((r) => r.wallet),
            ["0xfirst"]
          )
          yield* sql`DELETE FROM market_wallet_hours WHERE wallet = '0xfirst'`

          // The migration's backfill makes from the clears the rows the settling statements made.
          const all = () =>
            sql<{ hour_ms: string; wallet: string; spend: string; requests: string }>`
            SELECT hour_ms::text, wallet, spend::text, requests::text FROM market_wallet_hours ORDER BY 1, 2`
          const before = yield* all()
          assert.isAbove(before.length, 5)
          yield* sql`DELETE FROM market_wallet_hours`
          yield* sql.unsafe(WALLET_HOURS_OF_CLEARS)
          assert.deepStrictEqual(byHour(yield* all()), byHour(before))
          // Only the hours the window can still read (D564): a clear of 32 days ago is not summed.
          yield* sql`DELETE FROM market_wallet_hours`
          yield* sql`UPDATE market_clears SET at_ms = at_ms - ${32 * DAY} WHERE wallet = ${two.wallet}`
          yield* sql.unsafe(WALLET_HOURS_OF_CLEARS)
          assert.deepStrictEqual(byHour(yield* all()), byHour(before.filter((r) => r.wallet !== two.wallet)))
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
