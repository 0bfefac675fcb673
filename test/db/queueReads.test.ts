import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { TestDatabase } from "../support/Database.ts"

/**
 * The queue tables' reads (migration 0042, D553): the capacity functions, a lease's release and a key's unfolded
 * captures probe their indexes however small the tables are, where a plan made on a page or two would read the
 * whole table, every dead row of a busy minute included. Counted in one transaction on one connection:
 * `pg_stat_xact_user_tables` counts that connection's scans not yet sent to the server's statistics (its earlier
 * transactions' too, so the test takes differences), and nothing is sent while a transaction is open.
 */
const TABLES = ["capacity_leases", "capacity_slots", "credit_unfolded"] as const

const scans = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ relname: string; seq_scan: string; idx_scan: string }>`
    SELECT relname, seq_scan::text, coalesce(idx_scan, 0)::text AS idx_scan FROM pg_stat_xact_user_tables
    WHERE relname IN ${sql.in(TABLES)}`
  const of = (table: string, column: "seq_scan" | "idx_scan") =>
    Number(rows.find((row) => row.relname === table)?.[column] ?? 0)
  return Object.fromEntries(TABLES.map((t) => [t, { seq: of(t, "seq_scan"), idx: of(t, "idx_scan") }]))
})

describe("queue tables read through their indexes (D553)", () => {
  layer(TestDatabase, { timeout: 60_000 })((it) => {
    it.effect("taking and ending leases and summing a key's queue scan no table, however small", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        // A few rows of each, as a quiet router has: one page, where a sequential scan is the cheaper plan.
        yield* sql`
          INSERT INTO credit_unfolded (request_id, key_id, wallet, authorized, charged)
          SELECT 'seed-' || g, 'key-' || (g % 3), '0xabc', 100, g FROM generate_series(1, 30) g`
        yield* sql`ANALYZE capacity_leases, capacity_slots, credit_unfolded`
        const counted = yield* sql.withTransaction(
          Effect.gen(function* () {
            // What the connection's earlier transactions counted and has not sent yet is in the view too.
            const before = yield* scans
            // More calls than the 5 custom plans a cached statement makes before its generic one.
            for (let i = 0; i < 12; i++) {
              const [taken] = yield* sql<{ granted: boolean }>`
                SELECT acquire_capacity('p-scan', 'chat-small', 64, ${`lease-${i}`}, '20 minutes'::interval)
                  AS granted`
              assert.isTrue(taken!.granted)
            }
            for (let i = 0; i < 12; i += 2) {
              const [ended] = yield* sql<{ n: number }>`
                SELECT capacity_release(${[`lease-${i}`, `lease-${i + 1}`, "never-held"]}::text[]) AS n`
              assert.strictEqual(ended!.n, 2)
            }
            for (let i = 0; i < 12; i++) {
              const [held] = yield* sql<{ held: string }>`SELECT credit_unfolded_held('key-1')::text AS held`
              // Keys 1: seeds 1, 4, …, 28 hold 100 − g each.
              assert.strictEqual(held!.held, String(10 * 100 - (1 + 28) * 5))
            }
            const functions = yield* scans
            // The same reads written as plain statements: planned on these tables, they scan them.
            yield* sql`SELECT coalesce(sum(authorized - charged), 0) FROM credit_unfolded WHERE key_id = 'key-1'`
            yield* sql`SELECT count(*) FROM capacity_leases WHERE lease_id = 'lease-1'`
            const plain = yield* scans
            const since = (from: typeof before, to: typeof before) =>
              Object.fromEntries(
                TABLES.map((t) => [t, { seq: to[t]!.seq - from[t]!.seq, idx: to[t]!.idx - from[t]!.idx }])
              )
            return { functions: since(before, functions), plain: since(functions, plain) }
          })
        )
        assert.strictEqual(
          yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM capacity_leases`.pipe(
            Effect.map((rows) => rows[0]!.n)
          ),
          0
        )
        for (const table of TABLES) assert.strictEqual(counted.functions[table]!.seq, 0, `${table} scanned`)
        assert.isAbove(counted.functions.capacity_leases!.idx, 0)
        assert.isAbove(counted.functions.credit_unfolded!.idx, 0)
        // The control: the counter sees a scan, and the plain forms of the same reads make one.
        assert.isAbove(counted.plain.credit_unfolded!.seq, 0)
        assert.isAbove(counted.plain.capacity_leases!.seq, 0)
      })
    )

    // D567: a settling statement with no lease to end (warm leases, D555) calls the release with an empty list; it
    // returns at once, without the delete (whose plan was made afresh on every call), and the delete that does run
    // keeps one generic plan.
    it.effect("a release of no lease touches nothing, and the delete keeps a generic plan", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const locked = yield* sql.withTransaction(
          Effect.gen(function* () {
            const [none] = yield* sql<{ n: number }>`SELECT capacity_release('{}'::text[]) AS n`
            const [nil] = yield* sql<{ n: number }>`SELECT capacity_release(NULL::text[]) AS n`
            assert.deepStrictEqual([none!.n, nil!.n], [0, 0])
            // A delete that ran holds the table's row-exclusive lock to the end of the transaction.
            const rows = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_locks
              WHERE pid = pg_backend_pid() AND relation = 'capacity_leases'::regclass AND mode = 'RowExclusiveLock'`
            return rows[0]!.n
          })
        )
        assert.strictEqual(locked, 0, "the delete ran for an empty list")
        const [config] = yield* sql<{ config: ReadonlyArray<string> }>`
          SELECT proconfig AS config FROM pg_proc WHERE proname = 'capacity_release'`
        assert.includeMembers(
          [...config!.config],
          ["enable_seqscan=off", "plan_cache_mode=force_generic_plan"]
        )
      })
    )
  })
})
