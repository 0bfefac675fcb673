import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import { inject } from "vitest"
import { isAlive, isRunning } from "../../src/process/ChildProcess.ts"
import { listenablePort } from "./Ports.ts"
import { startStopwatch } from "./Stopwatch.ts"

/**
 * The router as an operator runs it (`npm start`): a separate process configured by environment
 * variables only, with its own Anvil (and its own Postgres unless `DATABASE_URL` is given).
 */
export interface RouterProcess {
  readonly child: ChildProcess
  readonly pid: number
  readonly base: string
  readonly output: () => string
  readonly exited: Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
}

/**
 * How the router is launched: `node` (the default: `src/main.ts` in a node of its own, as the suites have always
 * started it) or `npm` (`npm start` itself, the package's script: `pid` is then npm's, the router its child).
 */
export type Launch = "node" | "npm"

export const startRouterProcess = async (
  env: Record<string, string | undefined>,
  launch: Launch = "node"
): Promise<RouterProcess> => {
  const port = await listenablePort()
  const full: Record<string, string | undefined> = {
    ...process.env,
    PORT: String(port),
    OPERATOR_TOKEN: "process-test",
    ...env
  }
  delete full.RPC_URL
  if (env.DATABASE_URL === undefined) delete full.DATABASE_URL
  // `npm_execpath` is npm's own script when the suite runs under `npm test`; else the `npm` on the PATH.
  const npm = process.env.npm_execpath
  const [command, args] =
    launch === "node"
      ? [process.execPath, ["--import", "tsx", "src/main.ts"]]
      : npm === undefined
        ? ["npm", ["start"]]
        : [process.execPath, [npm, "start"]]
  const child = spawn(command, args, { env: full, stdio: ["ignore", "pipe", "pipe"] })
  let output = ""
  child.stdout?.on("data", (b) => {
    output += b
  })
  child.stderr?.on("data", (b) => {
    output += b
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal }))
  )
  return { child, pid: child.pid!, base: `http://127.0.0.1:${port}`, output: () => output, exited }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Waits until the router serves and the simulated fleet's quotes are in its book: 90 s on an idle machine,
 * times the slowdown the router's own main thread saw meanwhile (test/support/Stopwatch.ts). Under a load
 * of 25 on two cores a start of the current main and of one from before the treasury, market-data and task
 * slices both took about 115 s: the start is not slower, the machine is.
 */
export const waitUntilServing = async (router: RouterProcess, timeoutMs = 90_000) => {
  const stopwatch = startStopwatch(router.pid)
  while (stopwatch.elapsedMs() < timeoutMs * stopwatch.stretch()) {
    if (router.child.exitCode !== null) throw new Error(`the router exited:\n${router.output()}`)
    const book = await fetch(`${router.base}/v1/market/book`)
      .then((r) => r.json() as Promise<{ classes: Array<{ depth: number }> }>)
      .catch(() => ({ classes: [] }))
    if (book.classes.length > 0 && book.classes.every((c) => c.depth > 0)) return stopwatch.elapsedMs()
    await sleep(250)
  }
  throw new Error(
    `the router did not serve within ${timeoutMs} ms x its slowdown ${stopwatch.stretch().toFixed(2)}:\n${router.output()}`
  )
}

/** Polls `probe` every 250 ms (a failed probe counts as not yet) until it gives a value or `timeoutMs` pass. */
export const pollFor = async <A>(what: string, probe: () => Promise<A | undefined>, timeoutMs = 60_000) => {
  const started = Date.now()
  while (Date.now() - started < timeoutMs) {
    const value = await probe().catch(() => undefined)
    if (value !== undefined) return value
    await sleep(250)
  }
  throw new Error(`timed out waiting for ${what}`)
}

/** SIGKILL to `router` unless it already exited, then waits for its exit. */
export const stopped = async (router: RouterProcess) => {
  if (router.child.exitCode === null && router.child.signalCode === null) router.child.kill("SIGKILL")
  await router.exited
}

/** Child processes of `pid` still alive (Linux `/proc`; elsewhere none are found). */
export const childrenOf = (pid: number): Array<number> => {
  if (!existsSync("/proc")) return []
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .map(Number)
    .filter((child) => {
      try {
        const stat = readFileSync(`/proc/${child}/stat`, "utf8")
        return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === pid && isAlive(child)
      } catch {
        return false
      }
    })
}

/** Every process descended from `pid` that is still alive: its children, theirs, and so on. */
export const descendantsOf = (pid: number): Array<number> =>
  childrenOf(pid).flatMap((child) => [child, ...descendantsOf(child)])

/**
 * The pids among `pids` still running after up to `timeoutMs` (empty as soon as all have stopped). For
 * processes that stop on their own once the router is gone, such as tsx's esbuild service: it exits when
 * its stdin closes, which is after the router exited, however quickly.
 */
export const runningAfter = async (pids: ReadonlyArray<number>, timeoutMs = 10_000) => {
  const started = Date.now()
  for (;;) {
    const running = pids.filter(isRunning)
    if (running.length === 0 || Date.now() - started >= timeoutMs) return running
    await sleep(50)
  }
}

/** A fresh, empty database on the test server (the router migrates it), dropped by `drop`. */
export const freshDatabase = async () => {
  const admin = inject("adminDatabaseUrl")
  const name = `p_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`
  const run = (statement: string) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const sql = yield* PgClient.PgClient
        yield* sql.unsafe(statement)
      }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(admin) })), Effect.orDie)
    )
  await run(`CREATE DATABASE ${name}`)
  const url = new URL(admin)
  url.pathname = `/${name}`
  return {
    url: url.toString(),
    layer: PgClient.layer({ url: Redacted.make(url.toString()) }),
    drop: () => run(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
  }
}

/**
 * Runs `body` against `router`, then stops the router: at once (`kill`, SIGKILL) or gracefully (`drain`,
 * SIGTERM and its exit awaited; SIGKILL when `body` failed). A failing `body` prints the router's last output.
 */
export const whileRunning = async <A>(
  router: RouterProcess,
  end: "kill" | "drain",
  body: () => Promise<A>
): Promise<A> => {
  try {
    const value = await body()
    if (end === "drain") {
      router.child.kill("SIGTERM")
      await router.exited
    }
    return value
  } catch (error) {
    console.log(router.output().slice(-5000))
    throw error
  } finally {
    await stopped(router)
  }
}
