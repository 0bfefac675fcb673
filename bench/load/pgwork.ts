/**
 * `npm run bench:pgwork`: what the router's Postgres does per paid request (issue 12), counted instead of
 * timed. The router runs as `npm run bench:load` runs it (embedded Postgres in its `DATA_DIR`, the same
 * durability), with the server's statistics turned on in its `postgresql.conf` before the router starts it:
 * `pg_stat_statements` (every statement, those run by triggers and functions too), `track_functions`
 * (trigger calls) and `pg_walinspect` (the WAL records written, by kind: heap inserts, updates, HOT updates,
 * index entries). For the credit key, then x402, an open loop of `PGWORK_RATE` requests per second for
 * `PGWORK_SECONDS`; a phase ends once what the requests left to the background (the credit fold, receipt
 * signing, x402 settlement on Anvil) is done. Then an idle phase of the same length, no requests: what the
 * router's background costs without them. Prints per request answered (2xx): statements, rows per table, trigger
 * calls, WAL records and bytes, and the Postgres CPU (/proc). `PGWORK_JSON=file` writes the figures too.
 * Asserts nothing.
 */
import { execFileSync } from "node:child_process"
import { appendFileSync, chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { startEmbeddedPostgres } from "../../src/devnet/EmbeddedPostgres.ts"
import { Children, freePort, sleep } from "../support/Children.ts"
import { runMain } from "../support/RunMain.ts"
import { closedLoop, type LoadResult, openLoop, type Target } from "./Load.ts"
import { postgresCpuByRole, usage } from "./Proc.ts"
import { chatBody, postQuotes, startRouter, x402Payments } from "./Setup.ts"

const RATE = Number(process.env.PGWORK_RATE ?? 100)
const SECONDS = Number(process.env.PGWORK_SECONDS ?? 5)
const log = (line: string) => process.stderr.write(`[bench:pgwork] ${line}\n`)

const children = new Children(log)
children.stopOnSignals()

/** One query's rows as JSON, through psql (the server's own client; no pool of the router's touched). */
const query = <A>(url: string, text: string): ReadonlyArray<A> => {
  const out = execFileSync(
    "psql",
    [url, "-X", "-Atq", "-c", `SELECT coalesce(json_agg(q), '[]') FROM (${text}) q`],
    {
      encoding: "utf8"
    }
  )
  return JSON.parse(out) as ReadonlyArray<A>
}

interface Snapshot {
  readonly lsn: string
  readonly cpuMs: number
  readonly cpuByRole: Record<string, number>
  readonly at: number
  readonly tables: ReadonlyArray<{ table: string; ins: number; upd: number; hot: number; del: number }>
  readonly functions: ReadonlyArray<{ fn: string; calls: number; ms: number; self_ms: number }>
}

const snapshot = (url: string, routerPid: number): Snapshot => {
  const [{ lsn }] = query<{ lsn: string }>(url, "SELECT pg_current_wal_lsn()::text AS lsn") as [
    { lsn: string }
  ]
  return {
    lsn,
    cpuMs: usage(routerPid).cpuMs.postgres,
    cpuByRole: postgresCpuByRole(routerPid),
    at: Date.now(),
    tables: query(
      url,
      `SELECT relname AS table, n_tup_ins AS ins, n_tup_upd AS upd, n_tup_hot_upd AS hot, n_tup_del AS del
       FROM pg_stat_user_tables`
    ),
    functions: query(
      url,
      "SELECT funcname AS fn, calls, total_time AS ms, self_time AS self_ms FROM pg_stat_user_functions"
    )
  }
}

interface Phase {
  readonly name: string
  readonly requests: number
  readonly failures: number
  readonly seconds: number
  readonly pgCpuMsPerRequest: number
  /** By role; `exited`: processes that ended during the phase (autovacuum workers, mostly), whole lives. */
  readonly pgCpuMsPerRequestByRole: Record<string, number>
  readonly walBytesPerRequest: number
  readonly walFpiBytesPerRequest: number
  readonly statementsPerRequest: { readonly topLevel: number; readonly nested: number }
  readonly statements: ReadonlyArray<{
    query: string
    toplevel: boolean
    calls: number
    rows: number
    wal_bytes: number
    ms: number
    plans: number
    plan_ms: number
  }>
  readonly tables: ReadonlyArray<{ table: string; ins: number; upd: number; hot: number; del: number }>
  /** Calls, and milliseconds in the function with what it calls (`ms`) and in its own code (`self_ms`). */
  readonly triggers: ReadonlyArray<{ fn: string; calls: number; ms: number; self_ms: number }>
  readonly wal: ReadonlyArray<{ record: string; count: number; bytes: number; fpi_bytes: number }>
}

/** What changed between two snapshots, per request (`requests`: 1 for the idle phase, which is per second). */
const phaseOf = (
  url: string,
  name: string,
  before: Snapshot,
  after: Snapshot,
  load: { requests: number; failures: number }
): Phase => {
  // Per request answered: a refused one (no live quote on a stalled machine) wrote nothing.
  const per = Math.max(1, load.requests - load.failures)
  const statements = query<Phase["statements"][number]>(
    url,
    `SELECT regexp_replace(left(query, 2000), '\\s+', ' ', 'g') AS query, toplevel, calls, rows,
            wal_bytes::bigint AS wal_bytes, round(total_exec_time::numeric, 3) AS ms, plans,
            round(total_plan_time::numeric, 3) AS plan_ms
     FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND query NOT LIKE '%pg_stat_%' AND query NOT LIKE '%pg_current_wal_lsn%' AND query NOT LIKE '%pg_get_wal%'
     ORDER BY calls DESC`
  )
  const wal = query<Phase["wal"][number]>(
    url,
    `SELECT "resource_manager/record_type" AS record, count, record_size + fpi_size AS bytes, fpi_size AS fpi_bytes
     FROM pg_get_wal_stats('${before.lsn}', '${after.lsn}', true) WHERE count > 0 ORDER BY count DESC`
  )
  const tables = after.tables
    .map((t) => {
      const b = before.tables.find((x) => x.table === t.table)
      return {
        table: t.table,
        ins: t.ins - (b?.ins ?? 0),
        upd: t.upd - (b?.upd ?? 0),
        hot: t.hot - (b?.hot ?? 0),
        del: t.del - (b?.del ?? 0)
      }
    })
    .filter((t) => t.ins + t.upd + t.del > 0)
  const triggers = after.functions
    .map((f) => {
      const b = before.functions.find((x) => x.fn === f.fn)
      return {
        fn: f.fn,
        calls: f.calls - (b?.calls ?? 0),
        ms: f.ms - (b?.ms ?? 0),
        self_ms: f.self_ms - (b?.self_ms ?? 0)
      }
    })
    .filter((f) => f.calls > 0)
  const walBytes = wal.reduce((a, r) => a + Number(r.bytes), 0)
  const fpiBytes = wal.reduce((a, r) => a + Number(r.fpi_bytes), 0)
  return {
    name,
    requests: load.requests,
    failures: load.failures,
    seconds: (after.at - before.at) / 1000,
    pgCpuMsPerRequest: (after.cpuMs - before.cpuMs) / per,
    pgCpuMsPerRequestByRole: Object.fromEntries(
      Object.entries(after.cpuByRole)
        .map(([role, ms]) => [role, (ms - (before.cpuByRole[role] ?? 0)) / per] as const)
        .filter(([, ms]) => ms > 0)
    ),
    walBytesPerRequest: walBytes / per,
    walFpiBytesPerRequest: fpiBytes / per,
    statementsPerRequest: {
      topLevel: statements.filter((s) => s.toplevel).reduce((a, s) => a + s.calls, 0) / per,
      nested: statements.filter((s) => !s.toplevel).reduce((a, s) => a + s.calls, 0) / per
    },
    statements,
    tables,
    triggers,
    wal
  }
}

const f = (x: number, digits = 2) => x.toFixed(digits)

const print = (phase: Phase, idlePerSecond: Phase | undefined) => {
  const per = Math.max(1, phase.requests - phase.failures)
  const lines = [
    "",
    `== ${phase.name}: ${phase.requests} requests (${phase.failures} failed) over ${f(phase.seconds, 1)} s`,
    `Postgres CPU ${f(phase.pgCpuMsPerRequest)} ms/req; WAL ${f(phase.walBytesPerRequest, 0)} B/req (of which full-page images ${f(phase.walFpiBytesPerRequest, 0)}); statements ${f(phase.statementsPerRequest.topLevel)} top-level + ${f(phase.statementsPerRequest.nested)} nested per request`,
    `Postgres CPU by role, ms/req: ${Object.entries(phase.pgCpuMsPerRequestByRole)
      .map(([role, ms]) => `${role} ${f(ms)}`)
      .join(", ")}`,
    ...(idlePerSecond
      ? [
          `(idle background, per second: CPU ${f(idlePerSecond.pgCpuMsPerRequest)} ms, WAL ${f(idlePerSecond.walBytesPerRequest, 0)} B, ${f(idlePerSecond.statementsPerRequest.topLevel)} statements)`
        ]
      : []),
    "rows per request (table: inserted / updated (HOT) / deleted):",
    ...phase.tables.map(
      (t) =>
        `  ${t.table.padEnd(24)} ${f(t.ins / per)} / ${f(t.upd / per)} (${f(t.hot / per)}) / ${f(t.del / per)}`
    ),
    "function and trigger calls per request (calls, ms in it and what it calls, ms in its own code):",
    ...phase.triggers.map(
      (t) => `  ${t.fn.padEnd(32)} ${f(t.calls / per)}  ${f(t.ms / per, 3)}  ${f(t.self_ms / per, 3)}`
    ),
    "WAL records per request (kind: count, bytes):",
    ...phase.wal
      .filter((r) => r.count / per >= 0.05)
      .map((r) => `  ${r.record.padEnd(32)} ${f(r.count / per)}  ${f(Number(r.bytes) / per, 0)} B`),
    `planning: ${f(phase.statements.reduce((a, s) => a + s.plans, 0) / per)} plans, ${f(phase.statements.reduce((a, s) => a + Number(s.plan_ms), 0) / per, 3)} ms per request; execution ${f(phase.statements.filter((s) => s.toplevel).reduce((a, s) => a + Number(s.ms), 0) / per, 3)} ms per request (wall, lock waits included)`,
    "statements (calls/req, rows/call, WAL B/req, exec ms/req, plans/call, plan ms/req; * nested):",
    ...phase.statements
      .filter((s) => s.calls / per >= 0.02)
      .map(
        (s) =>
          `  ${f(s.calls / per).padStart(6)} ${f(s.rows / Math.max(1, s.calls), 1).padStart(6)} ${f(Number(s.wal_bytes) / per, 0).padStart(6)} ${f(s.ms / per, 3).padStart(7)} ${f(s.plans / Math.max(1, s.calls), 2).padStart(5)} ${f(Number(s.plan_ms) / per, 3).padStart(6)} ${s.toplevel ? " " : "*"} ${s.query.slice(0, 150)}`
      )
  ]
  process.stdout.write(`${lines.join("\n")}\n`)
}

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-pgwork-"))
  chmodSync(dataDir, 0o755)
  log(`logs and data in ${dataDir}`)
  if (process.env.BENCH_KEEP === undefined)
    children.atSignalExit(() => rmSync(dataDir, { recursive: true, force: true }))
  const routerDir = join(dataDir, "router")
  try {
    // The cluster made as the router makes it, then its statistics turned on for the router's start.
    await Effect.runPromise(Effect.scoped(startEmbeddedPostgres({ dataDir: routerDir, database: "router" })))
    appendFileSync(
      join(routerDir, "postgres", "postgresql.conf"),
      [
        "shared_preload_libraries = 'pg_stat_statements'",
        "pg_stat_statements.track = all",
        "pg_stat_statements.track_utility = off",
        "pg_stat_statements.track_planning = on",
        "pg_stat_statements.max = 5000",
        "track_functions = all",
        ""
      ].join("\n")
    )

    const mockPort = await freePort()
    children.start("mock", ["bench/load/mock.ts", String(mockPort)], {}, join(dataDir, "mock.log"))
    const mock = `http://127.0.0.1:${mockPort}`
    await children.waitFor("the mock", async () => (await fetch(`${mock}/held`)).ok, 30)
    const started = await startRouter(children, {
      dataDir: routerDir,
      logFile: join(dataDir, "router.log"),
      mock,
      log
    })
    const url = started.databaseUrl
    const pid = started.process.pid!
    execFileSync("psql", [url, "-X", "-q", "-c", "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"])
    execFileSync("psql", [url, "-X", "-q", "-c", "CREATE EXTENSION IF NOT EXISTS pg_walinspect"])

    const body = chatBody("Say hello to the load benchmark.", false)
    const credit: Target = {
      name: "credit key",
      url: `${started.router}/v1/chat/completions`,
      headers: () => ({ "x-credit-key": started.creditKey }),
      body
    }
    const warm = await closedLoop(credit, 10, 3)
    log(`warm-up: ${warm.requests} requests, ${warm.failures} failed`)

    /** Waits until nothing the requests left is still being settled (the x402 queue, the fold's queue, unsigned receipts). */
    const drained = async () => {
      const deadline = Date.now() + 90_000
      while (Date.now() < deadline) {
        const [row] = query<{ open: number }>(
          url,
          `SELECT (SELECT count(*) FROM x402_authorizations WHERE status IN ('reserved', 'pending', 'submitted'))
                + (SELECT count(*) FROM credit_unfolded)
                + (SELECT count(*) FROM receipts WHERE signature IS NULL AND body->>'settlement' IN ('landed', 'none'))
                + (SELECT count(*) FROM requests WHERE status = 'reserved') AS open`
        )
        if (row?.open === 0) return
        await sleep(500)
      }
      log("still settling after 90 s: the phase counts what was done by then")
    }

    const measured = async (name: string, run: () => Promise<LoadResult | undefined>) => {
      await drained()
      await sleep(3_000)
      query(url, "SELECT pg_stat_statements_reset()")
      const before = snapshot(url, pid)
      const result = await run()
      await drained()
      // An idle backend reports its table and function counts within 10 s (PGSTAT_IDLE_INTERVAL): let them.
      await sleep(11_000)
      const after = snapshot(url, pid)
      const load = result ?? { requests: Math.round((after.at - before.at) / 1000), failures: 0 }
      if (result)
        log(
          `${name}: ${result.requests} requests, ${result.failures} failed${result.firstFailure ? ` (${result.firstFailure})` : ""}`
        )
      return phaseOf(url, name, before, after, load)
    }

    const phases: Array<Phase> = []
    phases.push(await measured("credit key", () => openLoop(credit, RATE, SECONDS)))
    const payments = await x402Payments(started.router, body, Math.round(RATE * SECONDS))
    // Signing them can hold this process past the quotes' validity on a busy machine: quoted afresh.
    await postQuotes(started.router)
    let next = 0
    const x402: Target = { ...credit, name: "x402", headers: () => payments[next++ % payments.length]! }
    phases.push(await measured("x402", () => openLoop(x402, RATE, SECONDS)))
    const idle = await measured("idle (per second)", async () => {
      await sleep(SECONDS * 1000)
      return undefined
    })
    started.stop()
    for (const phase of phases) print(phase, idle)
    print(idle, undefined)
    if (process.env.PGWORK_JSON)
      writeFileSync(process.env.PGWORK_JSON, JSON.stringify([...phases, idle], null, 2))
  } finally {
    await children.stopAll()
    if (process.env.BENCH_KEEP === undefined) rmSync(dataDir, { recursive: true, force: true })
  }
}

runMain(main)
