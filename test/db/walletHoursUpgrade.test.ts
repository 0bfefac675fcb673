import { NodeServices } from "@effect/platform-node"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Redacted } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { migrations } from "../../src/db/migrations.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { reservedClear } from "../marketdata/support.ts"
import { freshDatabaseUrl } from "../support/Database.ts"

/**
 * Migration 0043 (wallet hours, D559) on a database another instance is settling on with the functions of 0041
 * (D564): the clear of a settlement that starts while the migration runs is counted once, by the backfill or by
 * the new functions, never by neither.
 */
const before0043 = Object.fromEntries(Object.entries(migrations).filter(([id]) => id < "0043"))
const OldDatabase = Layer.unwrap(
  Effect.map(freshDatabaseUrl, (url) =>
    Layer.provideMerge(
      PgMigrator.layer({ loader: Migrator.fromRecord(before0043) }),
      PgClient.layer({ url: Redacted.make(url), minConnections: 4, maxConnections: 10 })
    ).pipe(Layer.provide(NodeServices.layer))
  )
)
const LedgerLayer = Ledger.layer.pipe(Layer.provideMerge(Layer.mergeAll(OldDatabase, Chain.layer)))

const clearAt = (at: number) =>
  reservedClear({
    at,
    modelClass: "chat-small",
    providerId: "p-upgrade",
    tokens: { input: 120, output: 40 },
    tariff: { price_in: 100_000, price_out: 400_000 },
    ttftMs: 30
  }).pipe(Effect.orDie)

describe("the wallet-hours migration during settlements", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("a settlement that starts while the migration runs is counted in its wallet's hour", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const ledger = yield* Ledger
        const now = Date.now()
        // Settled before the upgrade, by the old functions: the backfill's to count.
        const earlier = yield* clearAt(now)
        yield* ledger.capture(earlier.record)
        const later = yield* clearAt(now + 1)

        // Another transaction holds a function's row, so the migration stops at replacing it, after its locks and
        // its backfill: the window in which an old instance's settlement may start.
        const held = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        // (Rolled back: a catalog row updated by a transaction that commits fails the one waiting on it.)
        const holder = yield* Effect.forkChild(
          sql
            .withTransaction(
              Effect.gen(function* () {
                yield* sql`ALTER FUNCTION market_clear_request(text) COST 101`
                yield* Deferred.succeed(held, undefined)
                yield* Deferred.await(release)
                return yield* Effect.fail("rolled back")
              })
            )
            .pipe(Effect.exit)
        )
        yield* Deferred.await(held)
        const waiting = Effect.map(
          sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
                             WHERE wait_event_type = 'Lock' AND datname = current_database()`,
          (rows) => rows[0]!.n
        )
        const waitFor = (n: number) =>
          Effect.gen(function* () {
            for (let i = 0; i < 200 && (yield* waiting) < n; i++) yield* Effect.sleep("25 millis")
            assert.strictEqual(yield* waiting, n)
          })
        const migrating = yield* Effect.forkChild(
          PgMigrator.run({ loader: Migrator.fromRecord(migrations) }).pipe(Effect.provide(NodeServices.layer))
        )
        yield* waitFor(1)
        // An old instance's settlement, now: it waits on the migration's lock.
        const settling = yield* Effect.forkChild(ledger.capture(later.record))
        yield* waitFor(2)
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        const ran = yield* Fiber.join(migrating)
        // 0043 first, and the later ones after it.
        assert.strictEqual(ran.map(([id, name]) => `${id}_${name}`)[0], "43_wallet_hours")
        yield* Fiber.join(settling)

        const clears = yield* sql<{ wallet: string; spend: string; requests: string }>`
          SELECT wallet, sum(charged)::text AS spend, count(*)::text AS requests FROM market_clears
          GROUP BY wallet ORDER BY wallet`
        assert.strictEqual(clears.length, 2)
        const hours = yield* sql<{ wallet: string; spend: string; requests: string }>`
          SELECT wallet, sum(spend)::text AS spend, sum(requests)::text AS requests FROM market_wallet_hours
          GROUP BY wallet ORDER BY wallet`
        assert.deepStrictEqual(hours, clears)
        assert.deepStrictEqual(
          hours.find((h) => h.wallet === later.wallet),
          { wallet: later.wallet, spend: String(later.charged), requests: "1" }
        )
      })
    )
  })
})
