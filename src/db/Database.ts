import { NodeServices } from "@effect/platform-node"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { Config, Effect, Layer, Option, Redacted } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import { startEmbeddedPostgres } from "../devnet/EmbeddedPostgres.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { applicationName } from "./Instances.ts"
import { migrations } from "./migrations.ts"

/**
 * The ids of `known` a migrated database has not applied. The migrator runs only ids above the
 * latest one a database has applied, so an id added below it (a branch landing after a higher one)
 * would be skipped forever, silently; this names it instead.
 */
export const skippedMigrations = (known: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ migration_id: number }>`SELECT migration_id FROM effect_sql_migrations`
    const applied = new Set(rows.map((r) => r.migration_id))
    return known.filter((id) => !applied.has(Number.parseInt(id, 10)))
  })

/** Refuses to start on a database that skipped a migration (see `skippedMigrations`). */
const assertNoneSkipped = Layer.effectDiscard(
  Effect.gen(function* () {
    const skipped = yield* skippedMigrations(Object.keys(migrations))
    if (skipped.length > 0)
      return yield* Effect.die(
        new Error(
          `migrations ${skipped.join(", ")} sit below this database's latest applied migration and were never run; give them ids above every id already on main`
        )
      )
  })
)

export const MigratorLayer = Layer.provideMerge(
  assertNoneSkipped,
  PgMigrator.layer({ loader: Migrator.fromRecord(migrations) })
)

/** The database URL: `DATABASE_URL` when set, else an embedded Postgres in `DATA_DIR`. */
export const databaseUrl = Effect.gen(function* () {
  const configured = yield* Config.Redacted("DATABASE_URL").pipe(Config.option)
  if (Option.isSome(configured)) return configured.value
  const { dataDir } = yield* RouterConfig
  return Redacted.make(yield* startEmbeddedPostgres({ dataDir, database: "router" }))
})

const clientFor = (url: Redacted.Redacted) =>
  PgClient.layer({ url, applicationName, connectTimeout: "10 seconds" })

/** SqlClient + PgClient with migrations applied. */
export const DatabaseLive = Layer.provideMerge(
  MigratorLayer,
  Layer.unwrap(Effect.map(databaseUrl, clientFor))
).pipe(Layer.provide(NodeServices.layer))

/** A database by URL (tests create one per file), migrated. */
export const databaseFromUrl = (url: string) =>
  Layer.provideMerge(MigratorLayer, clientFor(Redacted.make(url))).pipe(Layer.provide(NodeServices.layer))
