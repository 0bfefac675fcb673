import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { afterAll, describe, expect, inject, it } from "vitest"
import { freePort } from "../../src/devnet/EmbeddedPostgres.ts"
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

describe("npm start", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-start-"))
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

  it("serves, fills the book from the fleet within 15 s, and stops cleanly on SIGTERM", async () => {
    const port = await Effect.runPromise(freePort)
    const db = new URL(inject("adminDatabaseUrl"))
    const env: Record<string, string | undefined> = {
      ...process.env,
      PORT: String(port),
      DATA_DIR: dataDir,
      DATABASE_URL: db.toString(),
      OPERATOR_TOKEN: "start-test"
    }
    delete env.RPC_URL
    const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env,
      stdio: ["ignore", "pipe", "pipe"]
    })
    const stopwatch = startStopwatch(child.pid)
    let output = ""
    child.stdout.on("data", (b) => {
      output += b
    })
    child.stderr.on("data", (b) => {
      output += b
    })
    try {
      let depth = 0
      while (depth === 0 && child.exitCode === null && stopwatch.elapsedMs() < CEILING_MS) {
        const book = await fetch(`http://127.0.0.1:${port}/v1/market/book`)
          .then((r) => r.json() as Promise<{ classes: Array<{ depth: number }> }>)
          .catch(() => ({ classes: [] }))
        depth = book.classes.reduce((n, c) => n + c.depth, 0)
        if (depth === 0) await new Promise((r) => setTimeout(r, 100))
      }
      const elapsed = stopwatch.elapsedMs()
      const stretch = stopwatch.stretch()
      expect(depth, output).toBeGreaterThan(0)
      const timing = `book filled after ${Math.round(elapsed)} ms; the machine's load stretched the router ${stretch.toFixed(2)}x`
      console.log(timing)
      expect(elapsed, timing).toBeLessThan(PROMISED_MS * stretch)
      expect(output).toContain("svc router is serving")
      expect(output).toContain("eip155:31337")
      expect(output).not.toContain("start-test")
    } finally {
      child.kill("SIGTERM")
    }
    const code = await new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)))
    expect(code === 0 || code === null || code === 130 || code === 143).toBe(true)
  }, 180_000)
})
