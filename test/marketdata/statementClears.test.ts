import { PgClient } from "@effect/sql-pg"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer, Queue } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { chargeNumerator } from "../../src/domain/Billing.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { TestDatabase } from "../support/Database.ts"
import { fundedKey } from "../support/Keys.ts"
import { reservedClear } from "./support.ts"

/**
 * The market clears of a settling statement (D547): written once at the end of the statement that settles a
 * wallet's batch (its receipts' statement trigger), each rollup shard upserted once with the sums of its clears,
 * one notification per clear; and never at the cost of the settlement.
 */
const LedgerLayer = Ledger.layer.pipe(Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)))

const HOUR = 3_600_000

interface Spec {
  readonly providerId: string
  readonly at: number
  readonly input: number
  readonly output: number
  readonly ttftMs: number
}

/** A reservation on `key` and the record whose capture settles it, with real economics (so it clears). */
const reserved = (key: { keyId: string; wallet: string }, spec: Spec) =>
  reservedClear(
    {
      at: spec.at,
      modelClass: "chat-small",
      providerId: spec.providerId,
      tokens: { input: spec.input, output: spec.output },
      tariff: { price_in: 100_000 + spec.input, price_out: 400_000 + spec.output },
      ttftMs: spec.ttftMs
    },
    key
  ).pipe(Effect.orDie)

interface Rollup {
  clears: number
  tokens: number
  charge_num: number
  volume: number
  high: number
  low: number
  ttft_sum: number
}

const rollups = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ key: string } & { [K in keyof Rollup]: string }>`
    SELECT hour_ms || '/' || provider_id || '/' || shard AS key, clears::text, tokens::text, charge_num::text,
           volume::text, high::text, low::text, ttft_sum::text
    FROM market_rollups`
  return new Map(
    rows.map((r) => [
      r.key,
      {
        clears: Number(r.clears),
        tokens: Number(r.tokens),
        charge_num: Number(r.charge_num),
        volume: Number(r.volume),
        high: Number(r.high),
        low: Number(r.low),
        ttft_sum: Number(r.ttft_sum)
      }
    ])
  )
}).pipe(Effect.orDie)

/** The shard of a request's rollup row, as Postgres computes it (`hashtext(request_id) & 7`). */
const shardOf = (requestId: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ shard: number }>`SELECT hashtext(${requestId}) & 7 AS shard`.pipe(
      Effect.map((rows) => rows[0]!.shard)
    )
  ).pipe(Effect.orDie)

describe("a settling statement's market clears", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "N captures of a wallet in one statement: N clears, each rollup shard once with the row-by-row sums, one notification per clear",
      () =>
        Effect.scoped(
          Effect.gen(function* () {
            const ledger = yield* Ledger
            const sql = yield* SqlClient.SqlClient
            const pg = yield* PgClient.PgClient
            const key = yield* fundedKey({ budget: 10 ** 12, balance: 10 ** 12 })
            const base = Math.floor(Date.now() / HOUR) * HOUR
            // Two providers, two hours, token counts that give each clear its own price per token; the first nine
            // of one provider and hour, so that (eight shards) at least two share a rollup row.
            const specs: ReadonlyArray<Spec> = Array.from({ length: 14 }, (_, i) => ({
              providerId: i < 9 || i % 2 === 0 ? "pa" : "pb",
              at: base - (i >= 9 && i % 3 === 0 ? HOUR : 0) + i,
              input: 50 + 7 * i,
              output: i === 5 ? 0 : 10 + 3 * i,
              ttftMs: 20 + i
            }))
            const requests = yield* Effect.forEach(specs, (spec) => reserved(key, spec))
            const before = yield* rollups
            const notes = yield* pg.listen("market_clears")
            // Each rollup row written (inserted or updated), counted by a trigger of the test's own.
            yield* sql`CREATE TABLE test_rollup_writes (key text)`
            yield* sql`
              CREATE FUNCTION test_rollup_written() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN
                INSERT INTO test_rollup_writes VALUES (NEW.hour_ms || '/' || NEW.provider_id || '/' || NEW.shard);
                RETURN NULL;
              END $$`
            yield* sql`CREATE TRIGGER test_rollup_written AFTER INSERT OR UPDATE ON market_rollups
                       FOR EACH ROW EXECUTE FUNCTION test_rollup_written()`

            // Captured in the same turn: one settling statement (one transaction id on every receipt).
            yield* Effect.forEach(requests, (r) => ledger.capture(r.record), { concurrency: "unbounded" })
            const ids = requests.map((r) => r.requestId)
            const [xids] = yield* sql<{ n: number }>`
              SELECT count(DISTINCT xmin::text)::int AS n FROM receipts WHERE request_id IN ${sql.in(ids)}`
            assert.strictEqual(xids!.n, 1, "one settling statement")

            // Every capture cleared once, with its receipt's figures.
            const clears = yield* sql<{
              id: string
              request_id: string
              tokens_in: string
              tokens_out: string
              charged: string
              ttft_ms: number
              at_ms: string
              profile: string
              price_setter: string
            }>`
              SELECT id::text, request_id, tokens_in::text, tokens_out::text, charged::text, ttft_ms, at_ms::text,
                     profile, price_setter
              FROM market_clears WHERE request_id IN ${sql.in(ids)} ORDER BY market_clears.id`
            assert.strictEqual(clears.length, requests.length)
            for (const [i, request] of requests.entries()) {
              const clear = clears.find((c) => c.request_id === request.requestId)!
              assert.deepStrictEqual(
                [Number(clear.tokens_in), Number(clear.tokens_out), Number(clear.charged), clear.ttft_ms],
                [specs[i]!.input, specs[i]!.output, request.charged, specs[i]!.ttftMs]
              )
              assert.strictEqual(Number(clear.at_ms), specs[i]!.at)
              assert.deepStrictEqual([clear.profile, clear.price_setter], ["balanced", "runner-up"])
            }

            // The rollups moved as the old trigger moved them, one clear after another.
            const expected = new Map(before)
            for (const [i, request] of requests.entries()) {
              const spec = specs[i]!
              const shard = yield* shardOf(request.requestId)
              const key = `${spec.at - (spec.at % HOUR)}/${spec.providerId}/${shard}`
              const tokens = spec.input + spec.output
              const num = Number(
                chargeNumerator(
                  { input: spec.input, cachedInput: 0, output: spec.output },
                  request.record.receipt
                )
              )
              const perToken = tokens > 0 ? Math.round(num / tokens) : undefined
              const was = expected.get(key)
              expected.set(key, {
                clears: (was?.clears ?? 0) + 1,
                tokens: (was?.tokens ?? 0) + tokens,
                charge_num: (was?.charge_num ?? 0) + num,
                volume: (was?.volume ?? 0) + request.charged,
                high: Math.max(was?.high ?? 0, perToken ?? 0),
                low: Math.min(was?.low ?? Number.MAX_SAFE_INTEGER, perToken ?? Number.MAX_SAFE_INTEGER),
                ttft_sum: (was?.ttft_sum ?? 0) + spec.ttftMs
              })
            }
            const after = yield* rollups
            assert.deepStrictEqual(
              [...after.entries()].sort(),
              [...expected.entries()].map(([k, v]) => [k, v] as const).sort()
            )
            // Once per shard the statement's clears fall in, not once per clear.
            const writes = yield* sql<{ key: string; n: number }>`
              SELECT key, count(*)::int AS n FROM test_rollup_writes GROUP BY key`
            const moved = [...after.keys()].filter((k) => after.get(k)!.clears !== before.get(k)?.clears)
            assert.isBelow(moved.length, requests.length)
            assert.deepStrictEqual(writes.map((w) => [w.key, w.n]).sort(), moved.map((k) => [k, 1]).sort())
            yield* sql`DROP TRIGGER test_rollup_written ON market_rollups`

            // The wallet's hours (D559): its two hours' spend and requests, summed over the statement's clears.
            const spent = new Map<number, { spend: number; requests: number }>()
            for (const [i, request] of requests.entries()) {
              const hour = specs[i]!.at - (specs[i]!.at % HOUR)
              const was = spent.get(hour) ?? { spend: 0, requests: 0 }
              spent.set(hour, { spend: was.spend + request.charged, requests: was.requests + 1 })
            }
            const hours = yield* sql<{ hour_ms: string; spend: string; requests: string }>`
              SELECT hour_ms::text, spend::text, requests::text FROM market_wallet_hours
              WHERE wallet = ${key.wallet} ORDER BY hour_ms`
            assert.deepStrictEqual(
              hours.map((h) => [Number(h.hour_ms), Number(h.spend), Number(h.requests)]),
              [...spent.entries()].sort(([a], [b]) => a - b).map(([h, v]) => [h, v.spend, v.requests])
            )
            assert.strictEqual(hours.length, 2)

            // One notification per clear, in id order, each the clear's row.
            const heard = yield* Effect.forEach(clears, () =>
              Effect.map(
                Queue.take(notes),
                (note) => JSON.parse(note.payload) as { id: number; request_id: string }
              )
            )
            assert.deepStrictEqual(
              heard.map((note) => [String(note.id), note.request_id]),
              clears.map((clear) => [clear.id, clear.request_id])
            )
          })
        )
    )

    it.effect(
      "a clear that cannot be written is skipped, loudly, and its statement settles and clears the rest",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 10 ** 12, balance: 10 ** 12 })
          const spec = { providerId: "pc", at: Date.now(), input: 40, output: 12, ttftMs: 99_999 }
          const requests = yield* Effect.forEach([spec, { ...spec, ttftMs: 5 }], (s) => reserved(key, s))
          // A constraint the first clear breaks: the market's writes fail, the settlement's do not.
          yield* sql`ALTER TABLE market_clears ADD CONSTRAINT test_ttft CHECK (ttft_ms < 90000)`
          yield* Effect.forEach(requests, (r) => ledger.capture(r.record), { concurrency: "unbounded" })
          yield* sql`ALTER TABLE market_clears DROP CONSTRAINT test_ttft`
          const ids = requests.map((r) => r.requestId)
          const [row] = yield* sql<{
            captured: number
            receipts: number
            clears: number
            statements: number
          }>`
          SELECT (SELECT count(DISTINCT xmin::text)::int FROM receipts WHERE request_id IN ${sql.in(ids)}) AS statements,
                 (SELECT count(*)::int FROM requests WHERE request_id IN ${sql.in(ids)} AND status = 'captured')
                   AS captured,
                 (SELECT count(*)::int FROM receipts WHERE request_id IN ${sql.in(ids)}) AS receipts,
                 (SELECT count(*)::int FROM market_clears WHERE request_id IN ${sql.in(ids)}) AS clears`
          assert.deepStrictEqual(row, { statements: 1, captured: 2, receipts: 2, clears: 1 })
        }).pipe(Effect.orDie)
    )
  })
})
