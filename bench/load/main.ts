/**
 * `npm run bench:load`: the router under load beside a free gateway, in one run on one machine.
 *
 * Starts, each as a process of its own: a zero-latency OpenAI-compatible mock (`mock.ts`), the router
 * exactly as `npm start` runs it on its embedded defaults (embedded Postgres and Anvil in a temporary
 * DATA_DIR, no simulated fleet) with two registered providers quoting the mock and a funded credit key,
 * and the Portkey gateway (`@portkey-ai/gateway`, no payments) pointed at the same mock. Then drives, in
 * interleaved rounds, the mock directly, Portkey, and the router (credit key; x402 in the open loop)
 * with a closed loop at 50 and 500 connections and an open loop at 100 requests per second, and prints
 * one table: requests per second, p50/p99, latency added over the direct call under the same load,
 * the target's own CPU per request (node processes; the router's Postgres beside it) and RSS; then the
 * ratios and the memory figures (idle, per held-open stream, after the load). Asserts nothing. With one
 * router process and no `--inspect` in BENCH_ROUTER_NODE_ARGS the router listens for an inspector on a free
 * loopback port, through which the held-stream phase also reads memory after a full collection (D544).
 *
 * Knobs: BENCH_SECONDS (per closed-loop phase, default 8), BENCH_ROUNDS (default 2), BENCH_OPEN_SECONDS
 * (default 8), BENCH_RATE (the open loop's requests per second, default 100), BENCH_STREAMS (held-open
 * streams, default 5000), BENCH_LATE_SECONDS (how much longer than the "5 s after the streams" readings the
 * last RSS reading waits, default 36: past the router's 30 s quiet span, D552), BENCH_QUIET_SECONDS (how long after
 * the "idle after warm-up" reading the router is left quiet before the second idle reading, default 34; every target
 * is warmed again after it), BENCH_TARGETS (comma list of direct,portkey,router; default all),
 * BENCH_SNAPSHOTS=<dir> (the router writes a V8 heap snapshot there after 20 warm-up held streams and again with the
 * held streams open, `held-0.heapsnapshot` and `held-N.heapsnapshot`, and once more after the late RSS reading,
 * `after-N.heapsnapshot`, for `bench/heapDiff.ts`),
 * BENCH_ROUTER_NODE_ARGS (space-separated Node options for the router, as `--cpu-prof --cpu-prof-dir=<dir>`),
 * WORKERS (passed to the router unchanged), BENCH_STREAM=1 (the calls ask for SSE: what a streamed reply
 * costs; Portkey fails those, so with BENCH_TARGETS=direct,router). BENCH_ROUNDS=0 runs only the memory part.
 */
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, statSync } from "node:fs"
import { Agent } from "node:http"
import { availableParallelism, loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import { Children, freePort, post, sleep } from "../support/Children.ts"
import { runMain } from "../support/RunMain.ts"
import { median } from "../support/Stats.ts"
import { closedLoop, type LoadResult, openLoop, send, type Target } from "./Load.ts"
import { rssBytes, usage } from "./Proc.ts"
import { postgresRoundTrips, type RoundTrips } from "./RoundTrips.ts"
import { chatBody, startRouter, x402Payments } from "./Setup.ts"

const SECONDS = Number(process.env.BENCH_SECONDS ?? 8)
const OPEN_SECONDS = Number(process.env.BENCH_OPEN_SECONDS ?? 8)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2)
const STREAMS = Number(process.env.BENCH_STREAMS ?? 5000)
const LATE_SECONDS = Number(process.env.BENCH_LATE_SECONDS ?? 36)
const OPEN_RATE = Number(process.env.BENCH_RATE ?? 100)
const QUIET_SECONDS = Number(process.env.BENCH_QUIET_SECONDS ?? 34)
const STREAMED = process.env.BENCH_STREAM === "1"
const SNAPSHOTS = process.env.BENCH_SNAPSHOTS
const log = (line: string) => process.stderr.write(`[bench:load] ${line}\n`)
const MB = 1024 * 1024

// Processes

const children = new Children(log)
children.stopOnSignals()
const start = children.start.bind(children)
const waitFor = children.waitFor.bind(children)

/**
 * The router's V8 heap in use, from its own `/metrics` (`nodejs_heap_size_used_bytes`; with `WORKERS`,
 * the worker that answered): the lowest of four seconds of readings, so the garbage of what came before
 * counts as little as a collection in that time lets it (one reading once showed a collection as
 * -430 KB per stream).
 */
/**
 * A V8 heap snapshot of the router (started with `--heapsnapshot-signal=SIGUSR2`, which collects first and
 * writes into `--diagnostic-dir`), renamed `<name>.heapsnapshot` once written: the router's thread is busy
 * writing it until it answers again and the file stops growing.
 */
const heapSnapshot = async (pid: number, router: string, dir: string, name: string) => {
  const before = new Set(readdirSync(dir))
  process.kill(pid, "SIGUSR2")
  const deadline = Date.now() + 300_000
  let last = -1
  while (Date.now() < deadline) {
    await sleep(1_000)
    const file = readdirSync(dir).find((f) => f.endsWith(".heapsnapshot") && !before.has(f))
    if (file === undefined) continue
    const size = statSync(join(dir, file)).size
    const answers = await fetch(`${router}/health`).then(
      (r) => r.ok,
      () => false
    )
    if (answers && size === last) {
      renameSync(join(dir, file), join(dir, `${name}.heapsnapshot`))
      log(`heap snapshot ${join(dir, `${name}.heapsnapshot`)} (${fmt(size / MB, 0)} MB)`)
      return
    }
    last = size
  }
  throw new Error("the router wrote no heap snapshot in 5 minutes")
}

/**
 * A full collection of the router's heap through its inspector (`--inspect` on a port of the bench's choosing):
 * what is alive then, not what the collector has not reached yet, is what a held stream keeps (D544). The
 * session ends with the call.
 */
const collectGarbage = async (inspectPort: number) => {
  const [target] = (await (
    await fetch(`http://127.0.0.1:${inspectPort}/json/list`)
  ).json()) as ReadonlyArray<{
    readonly webSocketDebuggerUrl: string
  }>
  const socket = new WebSocket(target!.webSocketDebuggerUrl)
  await new Promise((resolve, reject) => {
    socket.addEventListener("open", resolve)
    socket.addEventListener("error", reject)
  })
  await new Promise<void>((resolve) => {
    socket.addEventListener("message", () => resolve())
    socket.send(JSON.stringify({ id: 1, method: "HeapProfiler.collectGarbage" }))
  })
  socket.close()
}

const heapUsed = async (router: string) => {
  const read = async () => {
    try {
      const text = await (await fetch(`${router}/metrics`)).text()
      const match = /^nodejs_heap_size_used_bytes\s+(\S+)/m.exec(text)
      return match ? Number(match[1]) : Number.NaN
    } catch {
      return Number.NaN
    }
  }
  let lowest = Number.POSITIVE_INFINITY
  for (let i = 0; i < 16; i++) {
    const value = await read()
    if (Number.isFinite(value)) lowest = Math.min(lowest, value)
    await sleep(250)
  }
  return Number.isFinite(lowest) ? lowest : Number.NaN
}

/**
 * Every garbage collection pause of the router's main thread so far, in ms (`nodejs_gc_duration_seconds`,
 * summed over its kinds, from `/metrics`; D569). With `WORKERS` a read answers for one process only: none.
 */
const gcPausedMs = async (router: string) => {
  if (Number(process.env.WORKERS ?? 1) > 1) return Number.NaN
  try {
    const text = await (await fetch(`${router}/metrics`)).text()
    const sums = [...text.matchAll(/^nodejs_gc_duration_seconds_sum(?:\{[^}]*\})?\s+(\S+)/gm)]
    return sums.length === 0 ? Number.NaN : 1000 * sums.reduce((total, m) => total + Number(m[1]), 0)
  } catch {
    return Number.NaN
  }
}

// Held-open streams

const holdStreams = async (target: Target, count: number, mock: string, settle: () => Promise<void>) => {
  const agent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY })
  let firstChunks = 0
  let failures = 0
  let socketErrors = 0
  const reasons = new Map<string, number>()
  const done: Array<Promise<void>> = []
  for (let i = 0; i < count; i++) {
    done.push(
      // No idle timeout: a held stream is silent after its first chunk until the release.
      send(agent, target, () => firstChunks++, 0).then(({ status, text }) => {
        if (status !== 200) {
          failures++
          // What failed, by kind: a status, or the socket's error (a reset: the accept queue overflowed, D423).
          // A refusal's error code too (capacity_exhausted, database_unavailable, no_eligible_quote, …).
          const code = /"code"\s*:\s*"([a-z_]+)"/.exec(text)?.[1]
          const reason =
            status === 0 ? text.slice(0, 60) : `HTTP ${status}${code === undefined ? "" : ` ${code}`}`
          reasons.set(reason, (reasons.get(reason) ?? 0) + 1)
        }
        if (status === 0) socketErrors++
      })
    )
    if (i % 200 === 199) await sleep(50)
  }
  const started = Date.now()
  const deadline = started + 120_000
  while (firstChunks + socketErrors < count && Date.now() < deadline) await sleep(250)
  const openedSeconds = (Date.now() - started) / 1000
  const held = JSON.parse(await (await fetch(`${mock}/held`)).text()).held as number
  await settle()
  await post(`${mock}/release`, {})
  await Promise.all(done)
  agent.destroy()
  if (reasons.size > 0)
    log(`held streams that failed: ${[...reasons].map(([r, n]) => `${n} × ${r}`).join("; ")}`)
  return { held, failures, openedSeconds }
}

// The table

interface Row {
  readonly target: string
  readonly load: string
  readonly result: LoadResult
  readonly cpuPerRequestMs: number
  /** The part of `cpuPerRequestMs` on the node processes' main threads. */
  readonly mainCpuPerRequestMs: number
  /** The part of `mainCpuPerRequestMs` the garbage collector paused it for (the router's `/metrics`; one process). */
  readonly gcPerRequestMs: number
  readonly dbCpuPerRequestMs: number
  /** The router's embedded Anvil (the chain its x402 reads and settlements go to). */
  readonly chainCpuPerRequestMs: number
  readonly rssMb: number
  /** Share of the target's runnable time spent waiting for a CPU (other work on the machine). */
  readonly cpuWait: number
}

const fmt = (x: number, digits = 1) => (Number.isFinite(x) ? x.toFixed(digits) : "-")
const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-load-"))
  // The embedded Postgres drops root privileges: its user must be able to reach its folder.
  chmodSync(dataDir, 0o755)
  const only = new Set((process.env.BENCH_TARGETS ?? "direct,portkey,router").split(","))
  log(`logs and data in ${dataDir}`)
  if (process.env.BENCH_KEEP === undefined)
    children.atSignalExit(() => rmSync(dataDir, { recursive: true, force: true }))
  const loadAtStart = loadavg()[0]!
  try {
    // The mock
    const mockPort = await freePort()
    start("mock", ["bench/load/mock.ts", String(mockPort)], {}, join(dataDir, "mock.log"))
    const mock = `http://127.0.0.1:${mockPort}`
    await waitFor("the mock", async () => (await fetch(`${mock}/held`)).ok, 30)

    // Portkey
    const portkeyPort = await freePort()
    const portkeyProcess = only.has("portkey")
      ? start(
          "portkey",
          ["node_modules/@portkey-ai/gateway/build/start-server.js", `--port=${portkeyPort}`, "--headless"],
          { NODE_ENV: "production" },
          join(dataDir, "portkey.log")
        )
      : undefined
    const portkey = `http://127.0.0.1:${portkeyPort}`

    // The router, as `npm start` runs it
    if (SNAPSHOTS !== undefined) mkdirSync(SNAPSHOTS, { recursive: true })
    const routerNodeArgs = (process.env.BENCH_ROUTER_NODE_ARGS ?? "").split(" ").filter((arg) => arg !== "")
    // One router process with no inspector of the caller's: the bench's own, for the collected readings (D544).
    const inspectPort =
      Number(process.env.WORKERS ?? 1) <= 1 && !routerNodeArgs.some((arg) => arg.startsWith("--inspect"))
        ? await freePort()
        : undefined
    const started = await startRouter(children, {
      nodeArgs: [
        ...(SNAPSHOTS === undefined
          ? []
          : ["--heapsnapshot-signal=SIGUSR2", `--diagnostic-dir=${SNAPSHOTS}`]),
        ...(inspectPort === undefined ? [] : [`--inspect=127.0.0.1:${inspectPort}`]),
        ...routerNodeArgs
      ],
      dataDir: join(dataDir, "router"),
      logFile: join(dataDir, "router.log"),
      mock,
      log,
      beforeReady: async () => {
        if (portkeyProcess) await waitFor("Portkey", async () => (await fetch(portkey)).ok, 60)
      }
    })
    const { router, creditKey } = started
    const routerProcess = started.process

    // Non-streaming calls under load: the Portkey gateway (1.15) fails streamed replies on Node 22 (it
    // appends headers to fetch's immutable response headers), and a whole reply is what a load
    // generator measures best. The router still streams from the mock (it always asks upstream for SSE).
    const body = chatBody("Say hello to the load benchmark.", STREAMED)
    const targets: Record<string, Target> = {
      direct: { name: "mock direct", url: `${mock}/v1/chat/completions`, headers: () => ({}), body },
      portkey: {
        name: "Portkey gateway",
        url: `${portkey}/v1/chat/completions`,
        headers: () => ({
          "x-portkey-provider": "openai",
          "x-portkey-custom-host": `${mock}/v1`,
          authorization: "Bearer sk-mock"
        }),
        body
      },
      router: {
        name: "router, credit key",
        url: `${router}/v1/chat/completions`,
        headers: () => ({ "x-credit-key": creditKey }),
        body
      }
    }
    if (process.env.BENCH_PAUSE !== undefined) {
      // A debugging aid: the set-up left running for a person with curl.
      log(
        `paused ${process.env.BENCH_PAUSE} s: router ${router} (x-credit-key ${creditKey}), portkey ${portkey}, mock ${mock}`
      )
      await sleep(Number(process.env.BENCH_PAUSE) * 1000)
    }
    const pids: Record<string, number | undefined> = {
      direct: undefined,
      portkey: portkeyProcess?.pid,
      router: routerProcess.pid
    }
    const order = ["direct", "portkey", "router"].filter((name) => only.has(name))

    // Warm up every target (JIT, pools, prepared statements), then take the router's idle RSS.
    for (const name of order) {
      const warm = await closedLoop(targets[name]!, 10, 3)
      log(`warm-up of ${name}: ${warm.requests} requests, p50 ${fmt(warm.p50)} ms, ${warm.failures} failed`)
    }
    await sleep(2_000)
    const idle = usage(routerProcess.pid!)
    // Idle once quiet: read from /proc only, with no request from here but the quote refresh (a `/metrics`
    // read would be one), so the router's idle collection (D271, D307, D411) can run: it looks every 2 s
    // and collects once nothing has started for 30 s (D552).
    await sleep(QUIET_SECONDS * 1000)
    const quietIdle = usage(routerProcess.pid!)
    const idleHeap = await heapUsed(router)
    const portkeyIdle = portkeyProcess ? rssBytes(portkeyProcess.pid!) : Number.NaN
    // That collection dropped the optimized code of the router's request path (D552): warm every target again,
    // or the router's first phase would be its recompilation.
    for (const name of order) await closedLoop(targets[name]!, 10, 2)

    const rows: Array<Row> = []
    const roundTrips: Array<RoundTrips> = []
    const measure = async (name: string, load: string, run: () => Promise<LoadResult>) => {
      const pid = pids[name]
      const routerRow = name === "router" || name === "x402"
      const gcBefore = routerRow ? await gcPausedMs(router) : Number.NaN
      const before = pid === undefined ? undefined : usage(pid)
      const result = await run()
      const after = pid === undefined ? undefined : usage(pid)
      const gcAfter = routerRow ? await gcPausedMs(router) : Number.NaN
      const cpu =
        before && after ? (after.cpuMs.node - before.cpuMs.node) / Math.max(1, result.requests) : Number.NaN
      const main =
        before && after
          ? (after.nodeMainCpuMs - before.nodeMainCpuMs) / Math.max(1, result.requests)
          : Number.NaN
      const db =
        before && after
          ? (after.cpuMs.postgres - before.cpuMs.postgres) / Math.max(1, result.requests)
          : Number.NaN
      const chain =
        before && after ? (after.cpuMs.anvil - before.cpuMs.anvil) / Math.max(1, result.requests) : Number.NaN
      rows.push({
        target: targets[name]?.name ?? name,
        load,
        result,
        cpuPerRequestMs: cpu,
        mainCpuPerRequestMs: main,
        gcPerRequestMs: (gcAfter - gcBefore) / Math.max(1, result.requests),
        dbCpuPerRequestMs: routerRow ? db : Number.NaN,
        chainCpuPerRequestMs: routerRow ? chain : Number.NaN,
        rssMb: after ? after.rss.node / MB : Number.NaN,
        cpuWait:
          before && after
            ? (after.nodeWaitedNs - before.nodeWaitedNs) /
              Math.max(1, after.nodeWaitedNs - before.nodeWaitedNs + after.nodeRanNs - before.nodeRanNs)
            : Number.NaN
      })
      log(
        `${name} ${load}: ${fmt(result.rps, 0)} req/s p50 ${fmt(result.p50)} p99 ${fmt(result.p99)} ms, ${result.failures} failed${result.firstFailure ? ` (${result.firstFailure})` : ""}`
      )
      await sleep(1_000)
    }

    // x402: signed payments made before each round's timed section (the paying client's work is not the
    // router's), per round: a payment signed for the first round is too close to its `validBefore` by the
    // last on a slow machine, and the router refuses it (402).
    const x402Count = Math.round(OPEN_RATE * OPEN_SECONDS)
    let payments: Array<Record<string, string>> = []
    let next = 0
    const x402Target: Target | undefined = only.has("router")
      ? {
          name: "router, x402",
          url: `${router}/v1/chat/completions`,
          headers: () => payments[next++ % payments.length]!,
          body
        }
      : undefined
    if (x402Target) {
      targets.x402 = x402Target
      pids.x402 = routerProcess.pid
    }

    for (let round = 1; round <= ROUNDS; round++) {
      log(`round ${round} of ${ROUNDS}`)
      for (const connections of [50, 500]) {
        for (const name of order) {
          await measure(name, `closed ${connections}`, () => closedLoop(targets[name]!, connections, SECONDS))
        }
      }
      if (x402Target) {
        log(`signing ${x402Count} x402 payments`)
        payments = await x402Payments(router, body, x402Count)
        next = 0
      }
      for (const name of [...order, ...(x402Target ? ["x402"] : [])]) {
        await measure(name, `open ${OPEN_RATE}/s`, () => openLoop(targets[name]!, OPEN_RATE, OPEN_SECONDS))
      }
      // The round trip a credit-key call waits for before it is served, alone, at the open loop's rate and at
      // ten times it: on this machine, between calls.
      if (only.has("router")) {
        for (const perSecond of [OPEN_RATE, OPEN_RATE * 10]) {
          const trips = await postgresRoundTrips(started.databaseUrl, perSecond, Math.min(OPEN_SECONDS, 5))
          roundTrips.push(trips)
          log(`Postgres round trips at ${perSecond}/s: p50 ${fmt(trips.p50, 3)} p99 ${fmt(trips.p99, 3)} ms`)
        }
      }
    }

    // After the load: the router's RSS once finished work has had time to go.
    await sleep(5_000)
    const afterLoad = usage(routerProcess.pid!)
    const afterLoadHeap = await heapUsed(router)
    // And once the router has been quiet long enough for its idle collection (30 s, D552): from /proc only.
    await sleep(QUIET_SECONDS * 1000)
    const quietAfterLoad = usage(routerProcess.pid!)

    // Held-open streams: memory per stream, router and Portkey.
    const holdBody = chatBody("Hold this stream open [[hold]]", true)
    const perStream: Record<
      string,
      {
        perStreamKb: number
        heapPerStreamKb: number
        collected: { readonly rssKb: number; readonly heapKb: number } | undefined
        held: number
        failures: number
        openedSeconds: number
      }
    > = {}
    // The router only: Portkey cannot stream on this Node (see above).
    for (const name of order.filter((n) => n === "router")) {
      const pid = pids[name]!
      if (SNAPSHOTS !== undefined) {
        // What a first held stream compiles or caches is not per stream: 20 held and let go first.
        await holdStreams({ ...targets[name]!, body: holdBody }, 20, mock, async () => {
          await sleep(500)
        })
        await sleep(3_000)
        await heapSnapshot(pid, router, SNAPSHOTS, "held-0")
      }
      // After a full collection (D544), then as the process stands (the bench's reading since D222).
      const collectedReading = async () => {
        if (inspectPort === undefined) return undefined
        await collectGarbage(inspectPort)
        await sleep(500)
        return { rss: rssBytes(pid), heap: await heapUsed(router) }
      }
      const collectedBefore = await collectedReading()
      const before = rssBytes(pid)
      const heapBefore = await heapUsed(router)
      let during = before
      let heapDuring = heapBefore
      let collectedDuring: { rss: number; heap: number } | undefined
      const { held, failures, openedSeconds } = await holdStreams(
        { ...targets[name]!, body: holdBody },
        STREAMS,
        mock,
        async () => {
          await sleep(1_000)
          during = rssBytes(pid)
          heapDuring = await heapUsed(router)
          collectedDuring = await collectedReading()
          if (SNAPSHOTS !== undefined) await heapSnapshot(pid, router, SNAPSHOTS, `held-${STREAMS}`)
        }
      )
      perStream[name] = {
        perStreamKb: (during - before) / 1024 / Math.max(1, held),
        heapPerStreamKb: (heapDuring - heapBefore) / 1024 / Math.max(1, held),
        collected:
          collectedBefore === undefined || collectedDuring === undefined
            ? undefined
            : {
                rssKb: (collectedDuring.rss - collectedBefore.rss) / 1024 / Math.max(1, held),
                heapKb: (collectedDuring.heap - collectedBefore.heap) / 1024 / Math.max(1, held)
              },
        held,
        failures,
        openedSeconds
      }
      log(
        `${name}: ${held} streams held (all open ${fmt(openedSeconds, 1)} s after the last was sent), ${failures} failed, ${fmt((during - before) / MB)} MB more RSS, ${fmt((heapDuring - heapBefore) / MB)} MB more heap`
      )
      await sleep(3_000)
    }
    const released = Date.now()
    await sleep(5_000)
    const afterStreams = usage(routerProcess.pid!)
    const afterStreamsHeap = await heapUsed(router)
    // Later, from /proc only: a request (a /metrics read) would keep the router from going quiet, and its
    // idle collection (D271, D307) runs only then. Settling thousands of released streams takes seconds.
    await sleep(LATE_SECONDS * 1000)
    const lateStreams = usage(routerProcess.pid!)
    const lateSeconds = Math.round((Date.now() - released) / 1000)
    // What the finished streams still keep (their replay), against `held-0`: read after the late RSS reading.
    if (SNAPSHOTS !== undefined) await heapSnapshot(routerProcess.pid!, router, SNAPSHOTS, `after-${STREAMS}`)
    started.stop()

    // Print
    const header = [
      "target".padEnd(20),
      "load".padEnd(11),
      "req/s".padStart(7),
      "p50 ms".padStart(8),
      "p99 ms".padStart(8),
      "+p50".padStart(7),
      "+p99".padStart(7),
      "failed".padStart(6),
      "cpu ms/req".padStart(10),
      "main ms/req".padStart(11),
      "gc ms/req".padStart(9),
      "pg ms/req".padStart(9),
      "chain ms/req".padStart(12),
      "rss MB".padStart(7),
      "cpu wait".padStart(8)
    ].join(" ")
    const directOf = (load: string) =>
      rows.filter((r) => r.target === targets.direct!.name && r.load === load)
    const lines: Array<string> = []
    const loads = [...new Set(rows.map((r) => r.load))]
    const names = [...new Set(rows.map((r) => r.target))]
    for (const load of loads) {
      for (const target of names) {
        const mine = rows.filter((r) => r.target === target && r.load === load)
        if (mine.length === 0) continue
        const direct = directOf(load)
        const p50 = median(mine.map((r) => r.result.p50))
        const p99 = median(mine.map((r) => r.result.p99))
        const added = (pick: (r: Row) => number, mineValue: number) =>
          direct.length === 0 || target === targets.direct!.name
            ? Number.NaN
            : mineValue - median(direct.map(pick))
        lines.push(
          [
            target.padEnd(20),
            load.padEnd(11),
            fmt(median(mine.map((r) => r.result.rps)), 0).padStart(7),
            fmt(p50).padStart(8),
            fmt(p99).padStart(8),
            fmt(added((r) => r.result.p50, p50)).padStart(7),
            fmt(added((r) => r.result.p99, p99)).padStart(7),
            String(mine.reduce((a, r) => a + r.result.failures, 0)).padStart(6),
            fmt(median(mine.map((r) => r.cpuPerRequestMs)), 2).padStart(10),
            fmt(median(mine.map((r) => r.mainCpuPerRequestMs)), 2).padStart(11),
            fmt(median(mine.map((r) => r.gcPerRequestMs)), 2).padStart(9),
            fmt(median(mine.map((r) => r.dbCpuPerRequestMs)), 2).padStart(9),
            fmt(median(mine.map((r) => r.chainCpuPerRequestMs)), 2).padStart(12),
            fmt(median(mine.map((r) => r.rssMb)), 0).padStart(7),
            `${fmt(100 * median(mine.map((r) => r.cpuWait)), 0)}%`.padStart(8)
          ].join(" ")
        )
      }
    }
    const rps = (target: string, load: string) =>
      median(rows.filter((r) => r.target === target && r.load === load).map((r) => r.result.rps))
    const p50Of = (target: string, load: string) =>
      median(rows.filter((r) => r.target === target && r.load === load).map((r) => r.result.p50))
    const ratios: Array<string> = []
    if (only.has("router") && only.has("portkey")) {
      for (const load of ["closed 50", "closed 500"]) {
        // Each round's ratio too: the rounds are interleaved, so a machine that slows between rounds slows both.
        const byRound = (target: string) =>
          rows.filter((r) => r.target === target && r.load === load).map((r) => r.result.rps)
        const portkeyRounds = byRound(targets.portkey!.name)
        const perRound = byRound(targets.router!.name).map((rps, i) => fmt(rps / portkeyRounds[i]!, 2))
        ratios.push(
          `  router/Portkey throughput, ${load}: ${fmt(rps(targets.router!.name, load) / rps(targets.portkey!.name, load), 2)} (by round: ${perRound.join(", ")})`
        )
      }
    }
    for (const perSecond of [...new Set(roundTrips.map((t) => t.perSecond))]) {
      const mine = roundTrips.filter((t) => t.perSecond === perSecond)
      ratios.push(
        `  one Postgres round trip (SELECT 1, the transport a reservation takes) at ${perSecond}/s: p50 ${fmt(median(mine.map((t) => t.p50)), 3)} ms, p99 ${fmt(median(mine.map((t) => t.p99)), 3)} ms`
      )
    }
    if (x402Target) {
      const openLoad = `open ${OPEN_RATE}/s`
      ratios.push(
        `  x402 over credit key, p50 at ${openLoad}: ${fmt(p50Of(x402Target.name, openLoad) - p50Of(targets.router!.name, openLoad))} ms`
      )
    }
    process.stdout.write(
      [
        "",
        `Load benchmark: ${ROUNDS} interleaved rounds, ${SECONDS} s per closed-loop phase, ${OPEN_SECONDS} s open loop; medians over rounds.`,
        `Machine: ${availableParallelism()} cores, load average ${fmt(loadAtStart)} at the start and ${fmt(loadavg()[0]!)} at the end (other work on the machine slows every target).`,
        "+p50/+p99: latency added over the mock called directly under the same load. cpu ms/req: the target's node",
        "processes' CPU time per request (/proc/<pid>/stat), main ms/req the part on their main threads (/proc/<pid>/task/<pid>/stat:",
        "the event loop, without worker, GC and I/O threads); gc ms/req: the router's main thread paused by its garbage collector",
        "(its /metrics, one process; the collector's helper threads are in cpu, not main); pg ms/req: the router's Postgres;",
        "chain ms/req: its embedded Anvil.",
        "rss: the target's node RSS after the phase.",
        "cpu wait: the share of the target's runnable time it spent waiting for a core (/proc/<pid>/schedstat; high = a busy machine).",
        "",
        header,
        ...lines,
        "",
        "Ratios (same run):",
        ...ratios,
        "",
        "Memory (router node processes, RSS; the router's V8 heap in use from its /metrics; Portkey beside it):",
        `  idle after warm-up            router ${fmt(idle.rss.node / MB, 0)} MB RSS, ${fmt(idleHeap / MB, 0)} MB heap   Portkey ${fmt(portkeyIdle / MB, 0)} MB RSS`,
        `  ${`idle, quiet ${QUIET_SECONDS} s more`.padEnd(29)} router ${fmt(quietIdle.rss.node / MB, 0)} MB RSS (from /proc, no request meanwhile but the quote refresh: after the idle collection)`,
        `  5 s after the load            router ${fmt(afterLoad.rss.node / MB, 0)} MB RSS (${fmt((afterLoad.rss.node - idle.rss.node) / MB, 0)} MB over idle), ${fmt(afterLoadHeap / MB, 0)} MB heap (${fmt((afterLoadHeap - idleHeap) / MB, 0)} MB over idle)`,
        `  ${`${QUIET_SECONDS + 5} s after the load`.padEnd(29)} router ${fmt(quietAfterLoad.rss.node / MB, 0)} MB RSS (${fmt((quietAfterLoad.rss.node - idle.rss.node) / MB, 0)} MB over idle; read from /proc only)`,
        ...Object.entries(perStream).flatMap(([name, s]) => [
          `  per held-open stream          ${name.padEnd(8)} ${fmt(s.perStreamKb, 1)} KB RSS, ${fmt(s.heapPerStreamKb, 1)} KB heap at ${s.held} streams (${s.failures} failed; all open ${fmt(s.openedSeconds, 1)} s after the last was sent)`,
          ...(s.collected === undefined
            ? []
            : [
                `  ... after full collections    ${name.padEnd(8)} ${fmt(s.collected.rssKb, 1)} KB RSS, ${fmt(s.collected.heapKb, 1)} KB heap (both readings after one, D544)`
              ])
        ]),
        `  5 s after the streams         router ${fmt(afterStreams.rss.node / MB, 0)} MB RSS (${fmt((afterStreams.rss.node - idle.rss.node) / MB, 0)} MB over idle), ${fmt(afterStreamsHeap / MB, 0)} MB heap (${fmt((afterStreamsHeap - idleHeap) / MB, 0)} MB over idle)`,
        `  ${`${lateSeconds} s after the streams`.padEnd(29)} router ${fmt(lateStreams.rss.node / MB, 0)} MB RSS (${fmt((lateStreams.rss.node - idle.rss.node) / MB, 0)} MB over idle; read from /proc only)`,
        `  router's Postgres RSS         ${fmt(afterStreams.rss.postgres / MB, 0)} MB (all its processes, shared pages counted in each)`,
        ""
      ].join("\n")
    )
  } finally {
    await children.stopAll()
    if (process.env.BENCH_KEEP === undefined) rmSync(dataDir, { recursive: true, force: true })
  }
}

runMain(main)
