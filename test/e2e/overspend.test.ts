import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { databaseUrlFor, runAt, sqlAt, testDatabaseUrl } from "../support/Database.ts"
import { fundedKey } from "../support/Keys.ts"
import { listenablePort } from "../support/Ports.ts"

/**
 * Zero overspend: 500 concurrent completions at one funded key whose cap covers far fewer,
 * through two router processes sharing one database, with clients hanging up at random.
 * The sum of captures never exceeds the cap and every reservation ends captured or released.
 */
const REQUESTS = 500
const database = `overspend_${randomBytes(4).toString("hex")}`

const dataDirOf = (port: number) => join(tmpdir(), `svc-overspend-${port}`)

const startRouter = async (port: number, dbUrl: string) => {
  const env: Record<string, string | undefined> = {
    ...process.env,
    PORT: String(port),
    DATABASE_URL: dbUrl,
    OPERATOR_TOKEN: "overspend-test",
    DATA_DIR: dataDirOf(port)
  }
  delete env.RPC_URL
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
  const started = Date.now()
  while (Date.now() - started < 60_000) {
    const depth = await fetch(`http://127.0.0.1:${port}/v1/market/book`)
      .then((r) => r.json() as Promise<{ classes: Array<{ model_class: string; depth: number }> }>)
      .then((b) => b.classes.find((c) => c.model_class === "chat-small")?.depth ?? 0)
      .catch(() => 0)
    if (depth > 0) return child
    await new Promise((r) => setTimeout(r, 250))
  }
  child.kill("SIGKILL")
  throw new Error(`router on ${port} did not start:\n${output.slice(-2000)}`)
}

describe("zero overspend across two router processes", () => {
  const routers: Array<ChildProcess> = []
  const ports: Array<number> = []

  beforeAll(async () => {
    await sqlAt(testDatabaseUrl(), `CREATE DATABASE ${database}`)
    // The first instance migrates the fresh database; the second finds it migrated.
    for (let i = 0; i < 2; i++) {
      const port = await listenablePort()
      ports.push(port)
      routers.push(await startRouter(port, databaseUrlFor(database)))
    }
  }, 180_000)

  afterAll(async () => {
    for (const router of routers) router.kill("SIGTERM")
    await Promise.all(routers.map((r) => new Promise((resolve) => r.once("exit", resolve))))
    for (const port of ports) rmSync(dataDirOf(port), { recursive: true, force: true })
    await sqlAt(testDatabaseUrl(), `DROP DATABASE IF EXISTS ${database} WITH (FORCE)`).catch(() => undefined)
  }, 60_000)

  it("never captures more than the cap and leaves no reservation behind", async () => {
    const db = databaseUrlFor(database)
    const body = { model: "chat-small", messages: [{ role: "user", content: "spend" }], max_tokens: 24 }
    const preview = (await fetch(`http://127.0.0.1:${ports[0]}/v1/routing/preview`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body)
    }).then((r) => r.json())) as {
      profiles: Array<{ profile: string; winner: { worst_case_charge: number } }>
    }
    const worstCase = preview.profiles.find((p) => p.profile === "as-sent")!.winner.worst_case_charge
    const budget = worstCase * 60
    const balance = budget * 10
    const { secret, keyId, wallet } = await runAt(db, fundedKey({ budget, balance }))

    const outcomes = await Promise.all(
      Array.from({ length: REQUESTS }, async (_, i) => {
        const controller = new AbortController()
        const hangUp = Math.random() < 0.3
        if (hangUp) setTimeout(() => controller.abort(), Math.floor(Math.random() * 400))
        try {
          const response = await fetch(`http://127.0.0.1:${ports[i % 2]}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json", "x-credit-key": secret },
            body: JSON.stringify({ ...body, stream: i % 3 === 0 }),
            signal: controller.signal
          })
          await response.text()
          return response.status
        } catch {
          return "hung-up" as const
        }
      })
    )
    const served = outcomes.filter((o) => o === 200).length
    const refused = outcomes.filter((o) => o === 402).length
    expect(served).toBeGreaterThan(0)
    expect(refused).toBeGreaterThan(0)
    // Served, refused at the cap, a busy market (every quote at its signed capacity), or hung up.
    const unexpected = outcomes.filter((o) => o !== 200 && o !== 402 && o !== 503 && o !== "hung-up")
    expect(unexpected).toEqual([])

    // Every reservation ends: captured or released (a hung-up request finishes within a second).
    const started = Date.now()
    let open = 1
    while (open > 0 && Date.now() - started < 60_000) {
      await new Promise((r) => setTimeout(r, 500))
      const rows = await sqlAt<{ n: number }>(
        db,
        "SELECT count(*)::int AS n FROM requests WHERE key_id = $1 AND status = 'reserved'",
        [keyId]
      )
      open = rows[0]!.n
    }
    expect(open).toBe(0)
    const [totals] = await sqlAt<{ captured: string; requests: number }>(
      db,
      "SELECT coalesce(sum(charged), 0)::text AS captured, count(*)::int AS requests FROM requests WHERE key_id = $1",
      [keyId]
    )
    const [key] = await sqlAt<{ spent: string; reserved: string }>(
      db,
      "SELECT spent::text, reserved::text FROM key_figures WHERE key_id = $1",
      [keyId]
    )
    const [purse] = await sqlAt<{ available: string; reserved: string }>(
      db,
      "SELECT available::text, reserved::text FROM balance_figures WHERE wallet = $1",
      [wallet]
    )
    const captured = Number(totals!.captured)
    expect(captured).toBeLessThanOrEqual(budget)
    expect(Number(key!.spent)).toBe(captured)
    expect(Number(key!.reserved)).toBe(0)
    expect(Number(purse!.reserved)).toBe(0)
    expect(Number(purse!.available)).toBe(balance - captured)
    process.stdout.write(
      `overspend: ${REQUESTS} requests, ${served} served, ${refused} refused at the cap, ${outcomes.filter((o) => o === "hung-up").length} hung up; captured ${captured} of a ${budget} cap\n`
    )
  }, 240_000)
})
