import { NodeServices } from "@effect/platform-node"
import { PgMigrator } from "@effect/sql-pg"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import { skippedMigrations } from "../../src/db/Database.ts"
import { migrations } from "../../src/db/migrations.ts"
import { TestDatabase } from "../support/Database.ts"

const schemaFingerprint = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  return yield* sql<{ table_name: string; column_name: string; data_type: string }>`
    SELECT table_name, column_name, data_type FROM information_schema.columns
    WHERE table_schema = 'public' ORDER BY table_name, ordinal_position
  `
})

/** The plan of `statement` with sequential scans priced out: it names an index only where one can serve the read. */
const plan = (
  statement: Effect.Effect<ReadonlyArray<Record<string, unknown>>, unknown, SqlClient.SqlClient>
) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql
      .withTransaction(Effect.andThen(sql`SET LOCAL enable_seqscan = off`, statement))
      .pipe(Effect.map((rows) => rows.map((row) => String(Object.values(row)[0])).join("\n")))
  )

describe("migrations", () => {
  layer(TestDatabase)((it) => {
    it.effect("apply on start, in order, and a second run changes nothing", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const applied = yield* sql<{ migration_id: number; name: string }>`
          SELECT migration_id, name FROM effect_sql_migrations ORDER BY migration_id
        `
        assert.deepStrictEqual(
          applied.map((m) => `${String(m.migration_id).padStart(4, "0")}_${m.name}`),
          Object.keys(migrations).sort()
        )
        const before = yield* schemaFingerprint
        const again = yield* PgMigrator.run({ loader: Migrator.fromRecord(migrations) }).pipe(
          Effect.provide(NodeServices.layer)
        )
        assert.strictEqual(again.length, 0)
        assert.deepStrictEqual(yield* schemaFingerprint, before)
      })
    )

    it.effect("a migration id below the latest applied one is named as skipped, not passed over", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        assert.deepStrictEqual(yield* skippedMigrations(Object.keys(migrations)), [])
        // A migration a branch adds below what this database already ran: the migrator never runs it.
        const below = { ...migrations, "0018_landed_late": Effect.void }
        const ran = yield* PgMigrator.run({ loader: Migrator.fromRecord(below) }).pipe(
          Effect.provide(NodeServices.layer)
        )
        assert.strictEqual(ran.length, 0)
        assert.deepStrictEqual(yield* skippedMigrations(Object.keys(below)), ["0018_landed_late"])
        assert.strictEqual(
          (yield* sql`SELECT 1 FROM effect_sql_migrations WHERE migration_id = 18`).length,
          0
        )
      })
    )

    it.effect(
      "no index is a prefix of another on the same table: each would be an index entry per row for nothing (D441)",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          // Plain (non-unique, non-partial, non-expression) btree indexes whose key columns begin another
          // btree index's key columns on the same table, the other one not partial either.
          const redundant = yield* sql<{ shorter: string; longer: string }>`
          SELECT a.indexrelid::regclass::text AS shorter, b.indexrelid::regclass::text AS longer
          FROM pg_index a
          JOIN pg_index b ON b.indrelid = a.indrelid AND b.indexrelid <> a.indexrelid
          JOIN pg_class c ON c.oid = a.indrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
          JOIN pg_class ai ON ai.oid = a.indexrelid JOIN pg_am aa ON aa.oid = ai.relam AND aa.amname = 'btree'
          JOIN pg_class bi ON bi.oid = b.indexrelid JOIN pg_am ba ON ba.oid = bi.relam AND ba.amname = 'btree'
          WHERE NOT a.indisunique AND a.indpred IS NULL AND b.indpred IS NULL AND a.indexprs IS NULL
            AND a.indnkeyatts <= b.indnkeyatts
            AND (a.indkey::int2[])[0:a.indnkeyatts - 1] = (b.indkey::int2[])[0:a.indnkeyatts - 1]
          ORDER BY 1, 2
        `
          assert.deepStrictEqual(redundant, [])
        })
    )

    it.effect(
      "an epoch's receipts, an instance's open reservations and unsigned receipts are read by index",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          assert.include(
            yield* plan(sql`
            EXPLAIN SELECT leaf FROM receipts WHERE epoch_id = ${"1"} AND leaf_index IS NOT NULL ORDER BY leaf_index`),
            "receipts_epoch_leaf"
          )
          assert.include(
            yield* plan(sql`
            EXPLAIN SELECT request_id FROM requests r WHERE r.status = 'reserved' AND r.instance_id IN (${"i_dead"})
            ORDER BY r.created_at LIMIT 100`),
            "requests_in_flight"
          )
          // The receipt signer's sweep (ReceiptStore.ts), by the partial index that holds only what it reads.
          assert.include(
            yield* plan(sql`
            EXPLAIN SELECT body FROM receipts
            WHERE signature IS NULL AND body->>'settlement' IN ('landed', 'none')
              AND created_at < now() - make_interval(secs => ${5})
            ORDER BY created_at LIMIT ${500}`),
            "receipts_unsigned"
          )
        })
    )

    it.effect("a task's lineage is read by index: its forks, and whether a fork still names a snapshot", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const forks = yield* plan(sql`
          EXPLAIN SELECT task_id, parent_snapshot_id FROM tasks WHERE parent_task_id = ${"task_x"} ORDER BY created_at
        `)
        assert.include(forks, "tasks_parent_task")
        const named = yield* plan(sql`
          EXPLAIN SELECT snapshot_id FROM workspace_snapshots s WHERE s.task_id IS NULL
            AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.parent_snapshot_id = s.snapshot_id)
        `)
        assert.include(named, "tasks_parent_snapshot")
      })
    )
  })
})
