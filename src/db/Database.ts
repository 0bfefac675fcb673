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

/**
 * The pool's connections, all kept open (D538). The pool's default (up to 10, each closed after 60 s unused)
 * left a router that went quiet for a minute with the one or two connections its background passes use:
 * the next burst opened the rest, each a new Postgres backend with cold caches and nothing prepared, and
 * its calls queued behind them (after 100 s of quiet, 100 calls a second read 4.5 / 128 / 305 ms at
 * p50 / p90 / p99 against 6.6 / 19.7 / 56.5 after 45 s). A router process holds all ten for its life: with
 * `WORKERS=N`, N × 10 and the primary's one (it only migrates).
 */
export const POOL_CONNECTIONS = 10

const clientFor = (url: Redacted.Redacted, connections = POOL_CONNECTIONS) =>
  PgClient.layer({
    url,
    applicationName,
    connectTimeout: "10 seconds",
    minConnections: connections,
    maxConnections: connections,
    // Kept connections sit idle through a quiet spell: over TCP (an external `DATABASE_URL`), keepalive
    // probes hold a NAT's or a balancer's idle mapping open and find a dead peer (a Unix socket has none).
    keepAlive: "60 seconds"
  })

/** SqlClient + PgClient with migrations applied. */
export const DatabaseLive = Layer.provideMerge(
  MigratorLayer,
  Layer.unwrap(Effect.map(databaseUrl, clientFor))
).pipe(Layer.provide(NodeServices.layer))

/** A database by URL (tests create one per file), migrated; `connections` kept open (D538). */
export const databaseFromUrl = (url: string, connections = POOL_CONNECTIONS) =>
  Layer.provideMerge(MigratorLayer, clientFor(Redacted.make(url), connections)).pipe(
    Layer.provide(NodeServices.layer)
  )
