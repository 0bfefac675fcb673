import { NodeServices } from "@effect/platform-node"
import { PgMigrator } from "@effect/sql-pg"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import { migrations } from "../../src/db/migrations.ts"
import { TestDatabase } from "../support/Database.ts"

const schemaFingerprint = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  return yield* sql<{ table_name: string; column_name: string; data_type: string }>`
    SELECT table_name, column_name, data_type FROM information_schema.columns
    WHERE table_schema = 'public' ORDER BY table_name, ordinal_position
  `
})

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
  })
})
