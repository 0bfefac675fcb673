import { NodeServices } from "@effect/platform-node"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { Config, Effect, Layer, Option, Redacted } from "effect"
import { Migrator } from "effect/sql"
import { startEmbeddedPostgres } from "../devnet/EmbeddedPostgres.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { applicationName } from "./Instances.ts"
import { migrations } from "./migrations.ts"

export const MigratorLayer = PgMigrator.layer({ loader: Migrator.fromRecord(migrations) })

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
