import { NodeServices } from "@effect/platform-node"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { assert, describe, layer, it as plain } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import { migrations } from "../../src/db/migrations.ts"
import { freshDatabaseUrl, TestDatabase } from "../support/Database.ts"
import { holdInTransaction } from "../support/Locks.ts"

/**
 * `acquire_capacity` (migration 0039, D541): a lease holds one numbered slot below the quote's ceiling, and a
 * taker passes over a slot another taker holds instead of waiting for its commit.
 */
const take = (provider: string, capacity: number, lease: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ granted: boolean }>`
      SELECT acquire_capacity(${provider}, 'chat-small', ${capacity}, ${lease}, '20 minutes'::interval) AS granted`
    return rows[0]!.granted
  })

const leases = (provider: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    return yield* sql<{ lease_id: string; slot: number }>`
      SELECT lease_id, slot FROM capacity_leases WHERE provider_id = ${provider} ORDER BY slot`
  })

describe("capacity slots (D541)", () => {
  layer(TestDatabase, { timeout: 60_000 })((it) => {
    it.effect("a taker does not wait for another taker's commit, and a slot taken in flight counts", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        // The slots are made by the first take (a taker that makes slots is waited for by another making the
        // same ones at that moment: once per (provider, class) as its concurrency grows).
        assert.isTrue(yield* take("p-wait", 3, "warm"))
        yield* sql`DELETE FROM capacity_leases WHERE lease_id = 'warm'`
        // One taker's transaction stays open with its lease taken (its slot locked, its lease not committed).
        const release = yield* holdInTransaction(take("p-wait", 3, "held"))
        // The advisory lock made this wait for that commit; a slot of its own needs no wait.
        const second = yield* take("p-wait", 3, "second").pipe(Effect.timeout("10 seconds"))
        assert.isTrue(second)
        assert.isTrue(yield* take("p-wait", 3, "third"))
        // Three of three: the held one (not committed yet) is one of them.
        assert.isFalse(yield* take("p-wait", 3, "fourth").pipe(Effect.timeout("10 seconds")))
        yield* release
        const held = yield* leases("p-wait")
        assert.deepStrictEqual(
          held.map((l) => l.slot),
          [0, 1, 2]
        )
        assert.sameMembers(
          held.map((l) => l.lease_id),
          ["held", "second", "third"]
        )
      })
    )

    it.effect("the ceiling holds under a race of takers, and a released slot is taken again", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const race = (n: number, prefix: string) =>
          Effect.all(
            Array.from({ length: n }, (_, i) => take("p-race", 7, `${prefix}-${i}`)),
            { concurrency: "unbounded" }
          )
        const first = yield* race(30, "a")
        assert.strictEqual(first.filter(Boolean).length, 7)
        const held = yield* leases("p-race")
        assert.deepStrictEqual(
          held.map((l) => l.slot),
          [0, 1, 2, 3, 4, 5, 6]
        )
        yield* sql`DELETE FROM capacity_leases WHERE provider_id = 'p-race' AND slot IN (1, 4, 5)`
        const second = yield* race(12, "b")
        assert.strictEqual(second.filter(Boolean).length, 3)
        assert.deepStrictEqual(
          (yield* leases("p-race")).map((l) => l.slot),
          [0, 1, 2, 3, 4, 5, 6]
        )
      })
    )

    it.effect("under a lowered ceiling, leases on the slots above it still count until they end", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        for (let i = 0; i < 4; i++) assert.isTrue(yield* take("p-lower", 4, `l-${i}`))
        const drop = (slot: number) =>
          sql`DELETE FROM capacity_leases WHERE provider_id = 'p-lower' AND slot = ${slot}`
        // The quote now says 2: four are in flight, so none until fewer than two are.
        assert.isFalse(yield* take("p-lower", 2, "x-1"))
        yield* drop(0)
        yield* drop(1)
        // Two in flight, both on slots above the new ceiling: at it.
        assert.isFalse(yield* take("p-lower", 2, "x-2"))
        yield* drop(3)
        // One in flight (slot 2): one more may go, on a slot below the ceiling.
        assert.isTrue(yield* take("p-lower", 2, "x-3"))
        assert.isFalse(yield* take("p-lower", 2, "x-4"))
        yield* drop(2)
        assert.isTrue(yield* take("p-lower", 2, "x-5"))
        assert.isFalse(yield* take("p-lower", 2, "x-6"))
        assert.deepStrictEqual(
          (yield* leases("p-lower")).map((l) => l.slot),
          [0, 1]
        )
      })
    )

    it.effect("an expired lease's slot is taken over, and slots are made as needed up to the ceiling", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        assert.isTrue(yield* take("p-expiry", 1, "old"))
        assert.isFalse(yield* take("p-expiry", 1, "refused"))
        yield* sql`UPDATE capacity_leases SET expires_at = now() - interval '1 second' WHERE lease_id = 'old'`
        assert.isTrue(yield* take("p-expiry", 1, "new"))
        assert.deepStrictEqual(yield* leases("p-expiry"), [{ lease_id: "new", slot: 0 }])

        // With every slot made and held, an expired one among them is taken over.
        for (let i = 0; i < 20; i++) assert.isTrue(yield* take("p-leak", 20, `k-${i}`))
        assert.isFalse(yield* take("p-leak", 20, "k-over"))
        yield* sql`UPDATE capacity_leases SET expires_at = now() - interval '1 second' WHERE lease_id = 'k-7'`
        assert.isTrue(yield* take("p-leak", 20, "k-20"))
        const [leak] = yield* sql<{ slots: number; leases: number; leaked: number }>`
          SELECT (SELECT count(*)::int FROM capacity_slots WHERE provider_id = 'p-leak') AS slots,
                 (SELECT count(*)::int FROM capacity_leases WHERE provider_id = 'p-leak') AS leases,
                 (SELECT count(*)::int FROM capacity_leases WHERE lease_id = 'k-7') AS leaked`
        assert.deepStrictEqual(leak, { slots: 20, leases: 20, leaked: 0 })

        for (let i = 0; i < 150; i++) assert.isTrue(yield* take("p-many", 150, `m-${i}`))
        assert.isFalse(yield* take("p-many", 150, "m-150"))
        const slots = (yield* leases("p-many")).map((l) => l.slot)
        assert.deepStrictEqual(
          slots,
          Array.from({ length: 150 }, (_, i) => i)
        )
        const [made] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM capacity_slots WHERE provider_id = 'p-many'`
        assert.strictEqual(made!.n, 150)
      })
    )
  })

  plain.effect("leases in flight when the migration runs get slots and count against the ceiling", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const url = yield* freshDatabaseUrl
        const migrate = (record: typeof migrations) =>
          PgMigrator.run({ loader: Migrator.fromRecord(record) }).pipe(Effect.provide(NodeServices.layer))
        yield* Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          yield* migrate(Object.fromEntries(Object.entries(migrations).filter(([id]) => id < "0039")))
          const lease = (id: string, provider: string, ageSeconds: number, expired = false) =>
            sql`INSERT INTO capacity_leases (lease_id, provider_id, model_class, acquired_at, expires_at)
                VALUES (${id}, ${provider}, 'chat-small', now() - make_interval(secs => ${ageSeconds}),
                        now() + ${expired ? "-1 second" : "20 minutes"}::interval)`
          // Requests in flight under the old function, taken in this order, one lease of them expired (never
          // released), and another provider's.
          yield* lease("x", "p-old", 20, true)
          yield* lease("c", "p-old", 10)
          yield* lease("a", "p-old", 9)
          yield* lease("b", "p-old", 8)
          yield* lease("o", "p-other", 5)
          yield* migrate(migrations)
          // The live ones first, in the order taken; the expired one after them.
          assert.deepStrictEqual(yield* leases("p-old"), [
            { lease_id: "c", slot: 0 },
            { lease_id: "a", slot: 1 },
            { lease_id: "b", slot: 2 },
            { lease_id: "x", slot: 3 }
          ])
          assert.deepStrictEqual(yield* leases("p-other"), [{ lease_id: "o", slot: 0 }])
          assert.isFalse(yield* take("p-old", 3, "refused"))
          assert.isFalse(yield* take("p-old", 2, "lowered"))
          // A fourth may go: on the expired lease's slot.
          assert.isTrue(yield* take("p-old", 4, "d"))
          assert.deepStrictEqual((yield* leases("p-old")).at(-1), { lease_id: "d", slot: 3 })
          assert.isFalse(yield* take("p-old", 4, "e"))
        }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
      })
    )
  )
})
