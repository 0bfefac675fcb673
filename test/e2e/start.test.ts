import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { afterAll, describe, expect, inject, it } from "vitest"
import { freePort } from "../../src/devnet/EmbeddedPostgres.ts"

/**
 * `npm start` as a user runs it: a separate process with nothing but environment
 * variables, its own Anvil and the simulated fleet. The fleet's quotes must be in the
 * public book within 15 s.
 */
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
    const started = Date.now()
    const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let output = ""
    child.stdout.on("data", (b) => {
      output += b
    })
    child.stderr.on("data", (b) => {
      output += b
    })
    try {
      let depth = 0
      while (Date.now() - started < 15_000 && depth === 0) {
        await new Promise((r) => setTimeout(r, 250))
        const book = await fetch(`http://127.0.0.1:${port}/v1/market/book`)
          .then((r) => r.json() as Promise<{ classes: Array<{ depth: number }> }>)
          .catch(() => ({ classes: [] }))
        depth = book.classes.reduce((n, c) => n + c.depth, 0)
      }
      expect(depth, output).toBeGreaterThan(0)
      expect(Date.now() - started).toBeLessThan(15_000)
      expect(output).toContain("svc router is serving")
      expect(output).toContain("eip155:31337")
      expect(output).not.toContain("start-test")
    } finally {
      child.kill("SIGTERM")
    }
    const code = await new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)))
    expect(code === 0 || code === null || code === 130 || code === 143).toBe(true)
  }, 60_000)
})
