import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { rmSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { databaseUrlFor, runAt, sqlAt, testDatabaseUrl } from "../support/Database.ts"
import { fundedKey } from "../support/Keys.ts"
import { listenablePort } from "../support/Ports.ts"

/**
 * Issue 12 item 6: `WORKERS=2 npm start` is two router processes behind one port, one database and one
 * chain (the primary's embedded Anvil and fleet); paid calls through the port settle in the one book,
 * and a SIGTERM drains both workers and stops everything, exit 0.
 */
const database = `workers_${randomBytes(4).toString("hex")}`

/** The node processes whose parent is `pid`. */
const nodeChildren = (pid: number) =>
  execFileSync("ps", ["-o", "pid=,args=", "--ppid", String(pid)])
    .toString()
    .split("\n")
    .filter((line) => line.includes("src/main.ts"))

describe("WORKERS=2: two router processes on one port", () => {
  let primary: ChildProcess
  let port = 0
  let output = ""
  const dataDir = `/tmp/svc-workers-${randomBytes(4).toString("hex")}`

  beforeAll(async () => {
    await sqlAt(testDatabaseUrl(), `CREATE DATABASE ${database}`)
    port = await listenablePort()
    const env: Record<string, string | undefined> = {
      ...process.env,
      WORKERS: "2",
      PORT: String(port),
      DATABASE_URL: databaseUrlFor(database),
      OPERATOR_TOKEN: "workers-test",
      DATA_DIR: dataDir
    }
    delete env.RPC_URL
    primary = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env,
      stdio: ["ignore", "pipe", "pipe"]
    })
    primary.stdout!.on("data", (b) => {
      output += b
    })
    primary.stderr!.on("data", (b) => {
      output += b
    })
    // Each worker syncs the book from the database once a second, so one worker showing quotes says
    // little of the other: wait until six fresh connections in a row (handed to the workers in turn)
    // all see depth.
    const started = Date.now()
    let seen = 0
    while (Date.now() - started < 270_000) {
      const depth = await fetch(`http://127.0.0.1:${port}/v1/market/book`, {
        headers: { connection: "close" }
      })
        .then((r) => r.json() as Promise<{ classes: Array<{ model_class: string; depth: number }> }>)
        .then((b) => b.classes.find((c) => c.model_class === "chat-small")?.depth ?? 0)
        .catch(() => 0)
      seen = depth > 0 ? seen + 1 : 0
      if (seen >= 6) return
      await new Promise((r) => setTimeout(r, 250))
    }
    throw new Error(`WORKERS=2 did not start:\n${output.slice(-3000)}`)
    // Three processes compile and start at once (the primary, then two workers): on a loaded machine
    // that takes minutes, not seconds.
  }, 300_000)

  afterAll(async () => {
    if (primary.exitCode === null) primary.kill("SIGKILL")
    await sqlAt(testDatabaseUrl(), `DROP DATABASE IF EXISTS ${database} WITH (FORCE)`).catch(() => undefined)
    rmSync(dataDir, { recursive: true, force: true })
  }, 60_000)

  it("serves paid calls from both workers into one book, then drains and exits 0 on SIGTERM", async () => {
    const workers = nodeChildren(primary.pid!)
    expect(workers.length, workers.join("\n")).toBe(2)

    const db = databaseUrlFor(database)
    const { secret, keyId } = await runAt(db, fundedKey({ budget: 100_000_000, balance: 100_000_000 }))
    // Fresh connections, handed to the workers in turn by the primary.
    const ids = await Promise.all(
      Array.from({ length: 12 }, async () => {
        const response = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-credit-key": secret, connection: "close" },
          body: JSON.stringify({
            model: "chat-small",
            messages: [{ role: "user", content: "hi" }],
            max_tokens: 8
          })
        })
        expect(response.status, await response.clone().text()).toBe(200)
        await response.text()
        return response.headers.get("x-request-id")!
      })
    )
    // Every receipt reads back signed from either worker.
    // Read right after the replies, from either worker: a reply can precede its settlement's commit (D534),
    // and a read served by the other worker waits for it through the book (`Receipts`), not a 404.
    for (const id of ids) {
      const receipt = (await fetch(`http://127.0.0.1:${port}/v1/receipts/${id}`).then((r) => r.json())) as {
        signature: string | null
        final: boolean
      }
      expect(receipt.final).toBe(true)
      expect(receipt.signature).toMatch(/^0x[0-9a-f]{130}$/)
    }
    const [key] = await sqlAt<{ spent: string; reserved: string; requests: number }>(
      db,
      "SELECT f.spent::text, f.reserved::text, k.requests::int FROM api_keys k JOIN key_figures f USING (key_id) WHERE key_id = $1",
      [keyId]
    )
    expect(key!.requests).toBe(12)
    expect(Number(key!.reserved)).toBe(0)

    const exited = new Promise<number | null>((resolve) => primary.once("exit", (code) => resolve(code)))
    primary.kill("SIGTERM")
    expect(await exited).toBe(0)
    for (const line of workers) {
      const pid = Number(line.trim().split(/\s+/)[0])
      expect(() => process.kill(pid, 0)).toThrow()
    }
  }, 180_000)
})
