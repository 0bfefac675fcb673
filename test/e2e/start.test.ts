import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { isAlive } from "../../src/process/ChildProcess.ts"
import {
  descendantsOf,
  freshDatabase,
  runningAfter,
  startRouterProcess,
  waitUntilServing
} from "../support/Process.ts"
import { startStopwatch } from "../support/Stopwatch.ts"

/**
 * `npm start` as a user runs it: a separate process with nothing but environment
 * variables, its own Anvil and the simulated fleet. The fleet's quotes must be in the
 * public book within 15 s.
 *
 * The 15 s are promised for a machine that runs nothing else. The time is measured from the spawn (not
 * from the banner: starting Anvil, deploying the contracts and migrating are part of the promise) and the
 * bound is 15 s times the slowdown the router's own main thread saw meanwhile (test/support/Stopwatch.ts):
 * 15 s flat on an idle machine such as CI's, proportionally more where other suites share the cores. The
 * book is polled until it fills (or a hard ceiling), so a slow start fails on its time, not on an empty book.
 */
const PROMISED_MS = 15_000
const CEILING_MS = 120_000

/** How often a process's main thread has blocked (waited for its event loop's next event) since it started. */
const voluntaryWakes = (pid: number) =>
  Number(
    /^voluntary_ctxt_switches:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/task/${pid}/status`, "utf8"))?.[1]
  )

describe("npm start", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-start-"))
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

  it("serves, fills the book from the fleet within 15 s, and stops cleanly on SIGTERM", async () => {
    // A database of its own: the router migrates it, and the server's default database is shared.
    const db = await freshDatabase()
    const router = await startRouterProcess({
      DATA_DIR: dataDir,
      DATABASE_URL: db.url,
      OPERATOR_TOKEN: "start-test"
    })
    const stopwatch = startStopwatch(router.pid)
    try {
      let depth = 0
      while (depth === 0 && router.child.exitCode === null && stopwatch.elapsedMs() < CEILING_MS) {
        const book = await fetch(`${router.base}/v1/market/book`)
          .then((r) => r.json() as Promise<{ classes: Array<{ depth: number }> }>)
          .catch(() => ({ classes: [] }))
        depth = book.classes.reduce((n, c) => n + c.depth, 0)
        if (depth === 0) await new Promise((r) => setTimeout(r, 100))
      }
      const elapsed = stopwatch.elapsedMs()
      const stretch = stopwatch.stretch()
      expect(depth, router.output()).toBeGreaterThan(0)
      const timing = `book filled after ${Math.round(elapsed)} ms; the load stretched the router ${stretch.toFixed(2)}x`
      expect(elapsed, timing).toBeLessThan(PROMISED_MS * stretch)
      expect(router.output()).toContain("svc router is serving")
      expect(router.output()).toContain("eip155:31337")
      expect(router.output()).not.toContain("start-test")
      // The accept queue a burst of new connections waits in (D423): `ss` shows a listener's as its Send-Q.
      const port = new URL(router.base).port
      const listener = execFileSync("ss", ["-Hltn", `sport = :${port}`], { encoding: "utf8" })
        .trim()
        .split(/\s+/)
      const somaxconn = Number(readFileSync("/proc/sys/net/core/somaxconn", "utf8"))
      expect(Number(listener[2]), listener.join(" ")).toBe(Math.min(4096, somaxconn))
      // Idle, the router's event loop wakes for its timers, not ~100 times a second for passes with nothing to
      // do (D572: the receipt signer, the credit fold and the warm leases' pass sleep until woken; at 948a215
      // an idle router woke 98-101 times a second, since 23-27). The quietest of three 2 s windows.
      const rates: Array<number> = []
      for (let window = 0; window < 3; window++) {
        const before = voluntaryWakes(router.pid)
        await new Promise((r) => setTimeout(r, 2_000))
        rates.push((voluntaryWakes(router.pid) - before) / 2)
      }
      expect(Math.min(...rates), `main thread wakes a second: ${rates.join(", ")}`).toBeLessThan(60)
      router.child.kill("SIGTERM")
      expect(await router.exited).toEqual({ code: 0, signal: null })
    } finally {
      if (router.child.exitCode === null) router.child.kill("SIGKILL")
      await router.exited
      await db.drop()
    }
  }, 180_000)

  it("a SIGTERM to `npm start` itself reaches the router: it drains, stops and leaves no process behind", async () => {
    // npm runs the script through `sh -c`; a shell that waits for its one command dies of the signal npm
    // passes on and leaves that command running (dash, Debian's sh, does not exec it). The script execs node.
    const db = await freshDatabase()
    const npmDataDir = mkdtempSync(join(tmpdir(), "svc-npm-start-"))
    const npm = await startRouterProcess({ DATA_DIR: npmDataDir, DATABASE_URL: db.url }, "npm")
    let below: Array<number> = []
    try {
      await waitUntilServing(npm)
      below = descendantsOf(npm.pid)
      // A process that ended since the listing has no command line left to read.
      const commandOf = (pid: number) => {
        try {
          return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")
        } catch {
          return []
        }
      }
      const routerPid = below.find((pid) => commandOf(pid).includes("src/main.ts"))
      expect(routerPid, `processes under npm: ${below.join(", ")}`).toBeDefined()
      npm.child.kill("SIGTERM")
      await npm.exited
      expect(await runningAfter(below, 30_000), npm.output().slice(-3000)).toEqual([])
      expect(isAlive(routerPid!)).toBe(false)
      expect(npm.output()).toContain("stopped")
    } finally {
      if (npm.child.exitCode === null) npm.child.kill("SIGKILL")
      await npm.exited
      // Whatever outlived npm (reparented, so no longer under it) goes too.
      for (const pid of below.filter(isAlive)) process.kill(pid, "SIGKILL")
      await db.drop()
      rmSync(npmDataDir, { recursive: true, force: true })
    }
  }, 180_000)
})
