import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { MarketSnapshot } from "../../src/domain/MarketData.ts"
import { MarketData } from "../../src/marketdata/MarketData.ts"
import { call, RouterUrl, routerLayer } from "../support/Router.ts"
import { ledgerClear } from "./support.ts"

const decodeSnapshot = Schema.decodeUnknownSync(MarketSnapshot)

/** The router with its real services and database, no fleet, and room for two event subscribers. */
const router = routerLayer().pipe(
  Layer.provide(
    ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ MARKET_EVENTS_CAPACITY: "2" }), { asPrimary: true })
  )
)

const until = <A>(label: string, probe: Effect.Effect<A | undefined>, timeoutMs = 10_000) =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const value = yield* probe
      if (value !== undefined) return value
      if (Date.now() > deadline) return yield* Effect.die(new Error(`timed out waiting for ${label}`))
      yield* Effect.sleep("50 millis")
    }
  })

/** An open events stream read frame by frame, cancelled when the test's scope closes. */
const openEvents = Effect.gen(function* () {
  const base = yield* RouterUrl
  const controller = new AbortController()
  yield* Effect.addFinalizer(() => Effect.sync(() => controller.abort()))
  const response = yield* Effect.promise(() =>
    fetch(`${base}/v1/market/events`, { signal: controller.signal })
  )
  if (response.status !== 200) return { response, frames: undefined, close: () => controller.abort() }
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let buffer = ""
  const next = Effect.promise(async () => {
    for (;;) {
      const end = buffer.indexOf("\n\n")
      if (end >= 0) {
        const frame = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        const data = frame.split("\n").find((line) => line.startsWith("data: "))
        if (data !== undefined) return JSON.parse(data.slice(6)) as unknown
        continue
      }
      const { done, value } = await reader.read()
      if (done) throw new Error("events stream ended")
      buffer += decoder.decode(value, { stream: true })
    }
  })
  return { response, frames: next, close: () => controller.abort() }
})

describe("market data from the ledger's records", () => {
  layer(router, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a captured request clears once; a released one does not; stats and candles count it", () =>
      Effect.gen(function* () {
        const now = Date.now()
        const one = yield* ledgerClear({
          at: now - 2_000,
          modelClass: "chat-small",
          providerId: "prov-a",
          tokens: { input: 1_000, output: 1_000 },
          tariff: { price_in: 1_000_000, price_out: 3_000_000 },
          ttftMs: 120
        })
        const two = yield* ledgerClear({
          at: now - 1_000,
          modelClass: "chat-small",
          providerId: "prov-b",
          tokens: { input: 2_000, output: 0 },
          tariff: { price_in: 500_000, price_out: 3_000_000 },
          ttftMs: 80
        })
        const released = yield* ledgerClear({
          at: now - 500,
          modelClass: "chat-small",
          providerId: "prov-a",
          tokens: { input: 1_000, output: 0 },
          tariff: { price_in: 1_000_000, price_out: 3_000_000 },
          ttftMs: 0,
          released: true
        })
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ request_id: string; charge_num: string }>`
          SELECT request_id, charge_num::text FROM market_clears ORDER BY id`
        assert.deepStrictEqual(
          rows.map((r) => [r.request_id, Number(r.charge_num)]),
          [
            [one.requestId, 4_000_000_000],
            [two.requestId, 1_000_000_000]
          ]
        )

        const market = yield* MarketData
        const snapshot = yield* until(
          "both clears on the tape",
          Effect.map(market.snapshot, (s) => (s.economics.last_clears.length >= 2 ? s : undefined))
        )
        assert.deepStrictEqual(
          snapshot.economics.last_clears.map((c) => [c.request_id, c.price, c.provider]),
          [
            [two.requestId, 500_000, "prov-b"],
            [one.requestId, 2_000_000, "prov-a"]
          ]
        )
        assert.notInclude(JSON.stringify(snapshot), released.requestId)
        assert.notInclude(JSON.stringify(snapshot), one.wallet)

        const stats = yield* call("/v1/market/stats")
        const small = (stats.json as { classes: Array<Record<string, unknown>> }).classes.find(
          (c) => c.model_class === "chat-small"
        )
        // 5,000,000,000 over 4,000 tokens = 1,250,000; the volume is the two charges (4,000 + 1,000).
        assert.deepInclude(small, {
          count: 2,
          volume_tokens: 4_000,
          volume: 5_000,
          vwap: 1_250_000,
          high: 2_000_000,
          low: 500_000,
          open: 2_000_000,
          last: 500_000,
          change: -1_500_000,
          change_bps: -7_500,
          ttft_p50_ms: 80,
          ttft_p90_ms: 120
        })
        const candles = yield* call(
          "/v1/market/candles?model_class=chat-small&window_ms=600000&bucket_ms=60000"
        )
        const body = candles.json as {
          candles: Array<{ count: number; vwap: number | null }>
          bucket_ms: number
        }
        assert.strictEqual(body.bucket_ms, 60_000)
        assert.strictEqual(
          body.candles.reduce((n, c) => n + c.count, 0),
          2
        )
        const index = yield* call("/v1/market/index?classes=chat-small,chat-large")
        const weights = (index.json as { components: Array<{ model_class: string; weight: number }> })
          .components
        assert.deepStrictEqual(
          weights.map((w) => [w.model_class, w.weight]),
          [
            ["chat-small", 1],
            ["chat-large", 0]
          ]
        )
      })
    )

    it.effect("out-of-range windows and unknown classes are a 400 that says which bound", () =>
      Effect.gen(function* () {
        const wide = yield* call("/v1/market/candles?window_ms=999999999999")
        assert.strictEqual(wide.status, 400)
        assert.include(wide.text, "window_ms")
        assert.include(wide.text, "86400000")
        const unknown = yield* call("/v1/market/index?classes=chat-small,nope")
        assert.strictEqual(unknown.status, 400)
        assert.include(unknown.text, "nope")
        const clamped = yield* call("/v1/market/candles?window_ms=86400000&bucket_ms=1")
        assert.strictEqual((clamped.json as { bucket_ms: number }).bucket_ms, 60_000)
        assert.strictEqual((clamped.json as { candles: Array<unknown> }).candles.length, 1_440)
      })
    )

    it.effect("event frames decode with the snapshot's schema and follow a new clear", () =>
      Effect.scoped(
        Effect.gen(function* () {
          const snapshot = decodeSnapshot((yield* call("/v1/market/snapshot")).json)
          const events = yield* openEvents
          assert.strictEqual(events.response.headers.get("content-type"), "text/event-stream")
          const first = decodeSnapshot(yield* events.frames!)
          assert.isAtLeast(first.sequence, snapshot.sequence)
          const cleared = yield* ledgerClear({
            at: Date.now(),
            modelClass: "chat-large",
            providerId: "prov-c",
            tokens: { input: 100, output: 100 },
            tariff: { price_in: 2_000_000, price_out: 6_000_000 },
            ttftMs: 200
          })
          for (;;) {
            const frame = decodeSnapshot(yield* events.frames!)
            assert.isAbove(frame.sequence, first.sequence)
            if (frame.economics.last_clears[0]?.request_id === cleared.requestId) break
          }
        })
      )
    )

    it.effect(
      "at subscriber capacity the events answer 503 with Retry-After; a hang-up frees the place",
      () =>
        Effect.scoped(
          Effect.gen(function* () {
            const market = yield* MarketData
            const a = yield* openEvents
            const b = yield* openEvents
            assert.strictEqual(a.response.status, 200)
            assert.strictEqual(b.response.status, 200)
            const refused = yield* call("/v1/market/events")
            assert.strictEqual(refused.status, 503)
            assert.strictEqual(refused.headers.get("retry-after"), "10")
            assert.include(refused.text, "/v1/market/snapshot")
            assert.include(refused.text, "subscriber_capacity")
            a.close()
            yield* until(
              "the hung-up subscriber released",
              Effect.sync(() => (market.fanout.size() < 2 ? true : undefined))
            )
            const again = yield* openEvents
            assert.strictEqual(again.response.status, 200)
          })
        )
    )
  })
})
