import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { inject } from "vitest"
import { databaseFromUrl } from "../../src/db/Database.ts"

const withDatabase = (url: string, name: string) => {
  const parsed = new URL(url)
  parsed.pathname = `/${name}`
  return parsed.toString()
}

/** Runs one statement against the admin database on a short-lived connection. */
const admin = (statement: string) =>
  Effect.gen(function* () {
    const sql = yield* PgClient.PgClient
    yield* sql.unsafe(statement)
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(inject("adminDatabaseUrl")) })), Effect.orDie)

/** The URL of a fresh, empty database, dropped when the scope closes. */
export const freshDatabaseUrl = Effect.gen(function* () {
  const name = `t_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`
  yield* Effect.acquireRelease(admin(`CREATE DATABASE ${name}`), () =>
    admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).pipe(Effect.ignore)
  )
  return withDatabase(inject("adminDatabaseUrl"), name)
})

/**
 * A fresh, migrated database for one test file, dropped when the layer is released:
 * tests never see each other's rows and never depend on what ran before.
 */
export const TestDatabase = Layer.unwrap(Effect.map(freshDatabaseUrl, databaseFromUrl))

export const testDatabaseUrl = () => inject("adminDatabaseUrl")

/** The URL of the database `name` on the test server. */
export const databaseUrlFor = (name: string) => withDatabase(testDatabaseUrl(), name)

/**
 * Runs `effect` against the database at `url` on a short-lived connection: for tests that drive router
 * processes from plain promises.
 */
export const runAt = <A, E>(url: string, effect: Effect.Effect<A, E, SqlClient.SqlClient>) =>
  Effect.runPromise(effect.pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) }))))

/** One statement at `url` (as `runAt`), with positional parameters. */
export const sqlAt = <A extends object>(
  url: string,
  statement: string,
  params: ReadonlyArray<unknown> = []
) =>
  runAt(
    url,
    Effect.gen(function* () {
      const client = yield* PgClient.PgClient
      return yield* client.unsafe<A>(statement, params as Array<unknown>)
    })
  )

/**
 * Returns once a session of this database waits on a row lock, or once `done()` says the statement
 * watched already finished (it never had to wait).
 */
export const lockWaited = (done: () => boolean) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'`.pipe(
      Effect.repeat({ until: (rows) => rows[0]!.n > 0 || done() }),
      Effect.orDie
    )
  })
