import { assert, describe, layer } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import { POOL_CONNECTIONS } from "../../src/db/Database.ts"
import { applicationName } from "../../src/db/Instances.ts"
import { TestDatabase } from "../support/Database.ts"

/** This process's connections to the current database, as Postgres lists them: their backends' pids. */
const ownBackends = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ pid: number }>`
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = ${applicationName}
    ORDER BY pid
  `
  return rows.map((row) => row.pid)
})

describe("the database pool (D538)", () => {
  layer(TestDatabase)((it) => {
    it.effect(
      "opens every connection at start and keeps them, so a burst after a quiet minute opens none",
      () =>
        Effect.gen(function* () {
          // The pool fills itself in the background from its start: all of them, though only one is in use.
          const open = yield* ownBackends.pipe(
            Effect.repeat({
              until: (pids) => pids.length >= POOL_CONNECTIONS,
              schedule: Schedule.spaced("50 millis"),
              times: 100
            })
          )
          assert.strictEqual(open.length, POOL_CONNECTIONS)
          // A pool that may shrink closes what it does not use after its idle time (60 s by default); a
          // fixed one has no idle time. Ten statements at once are served by the backends already open.
          const sql = yield* SqlClient.SqlClient
          const served = yield* Effect.forEach(
            Array.from({ length: POOL_CONNECTIONS }, (_, i) => i),
            (i) => sql<{ pid: number }>`SELECT pg_backend_pid() AS pid, pg_sleep(0.05), ${i}::int`,
            { concurrency: "unbounded" }
          )
          for (const [row] of served) assert.include(open, row?.pid)
          assert.deepStrictEqual(yield* ownBackends, open)
        })
    )
  })
})
