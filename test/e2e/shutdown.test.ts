import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { afterAll, describe, expect, it } from "vitest"
import { isAlive } from "../../src/process/ChildProcess.ts"
import { fundedKey } from "../support/Keys.ts"
import {
  childrenOf,
  freshDatabase,
  pollFor,
  runningAfter,
  startRouterProcess,
  waitUntilServing
} from "../support/Process.ts"
import { loadStretch } from "../support/Stopwatch.ts"

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface OpenStream {
  readonly requestId: string
  readonly body: Promise<string>
}

/** A streaming chat completion, retried while the market is at capacity; resolves once headers arrived. */
const openStream = async (
  base: string,
  key: string,
  model: string,
  maxTokens: number
): Promise<OpenStream> => {
  for (let attempt = 0; attempt < 100; attempt++) {
    const response = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-credit-key": key },
      body: JSON.stringify({
        model,
        stream: true,
        max_tokens: maxTokens,
        // The simulated providers reply at length to this marker, cut at max_tokens.
        messages: [{ role: "user", content: "Tell me a long story [[sim:long]]" }]
      })
    })
    if (response.status === 503) {
      await response.text()
      await sleep(200)
      continue
    }
    if (response.status !== 200) throw new Error(`${response.status}: ${await response.text()}`)
    return { requestId: response.headers.get("x-request-id")!, body: response.text() }
  }
  throw new Error("the market stayed at capacity")
}

/** The last chunk with a finish reason, and whether the stream ended with `[DONE]`. */
const ending = (body: string) => ({
  done: body.trimEnd().endsWith("data: [DONE]"),
  finishReason: [...body.matchAll(/"finish_reason":"(\w+)"/g)].at(-1)?.[1]
})

describe("graceful shutdown of a real `npm start`", () => {
  // The deadline itself (DRAIN_TIMEOUT_SECONDS) is exercised in process: test/process/drain.test.ts.
  const dataDir = mkdtempSync(join(tmpdir(), "svc-shutdown-"))
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

  it(
    "drains 40 streams on SIGTERM: short ones finish, a second signal cuts the long ones, each billed, exit 0",
    async () => {
      const db = await freshDatabase()
      const router = await startRouterProcess({
        DATA_DIR: dataDir,
        DATABASE_URL: db.url,
        // Long enough for the short streams on a loaded machine; the long ones are cut by a second signal.
        DRAIN_TIMEOUT_SECONDS: "120",
        RECONCILIATION_INTERVAL_SECONDS: "0"
      })
      const query = <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
        Effect.runPromise(effect.pipe(Effect.provide(db.layer), Effect.orDie))
      try {
        await waitUntilServing(router)
        const anvilPid = Number(readFileSync(join(dataDir, "chain", "anvil.pid"), "utf8"))
        const children = childrenOf(router.pid)
        expect(children).toContain(anvilPid)
        const { secret, keyId } = await query(fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 }))

        // 20 that end within a second or two, 20 that would stream for a minute.
        const models = ["chat-small", "chat-medium", "chat-large", "auto"]
        const [short, long] = await Promise.all([
          Promise.all(
            Array.from({ length: 20 }, (_, i) => openStream(router.base, secret, models[i % 4]!, 120))
          ),
          Promise.all(
            Array.from({ length: 20 }, (_, i) => openStream(router.base, secret, models[i % 4]!, 4000))
          )
        ])

        // A market events subscriber holds its connection open with no paid work behind it.
        const events = await fetch(`${router.base}/v1/market/events`)
        expect(events.status).toBe(200)
        const eventsEnd = events.text().then(
          (body) => ({ ended: "cleanly" as const, body }),
          (error: unknown) => ({ ended: "cut" as const, body: String(error) })
        )

        router.child.kill("SIGTERM")
        // The signal is taken when the router's loop next runs: on a loaded machine that can be well after
        // a fixed pause, and a paid call sent before it would be served. Wait until `/ready` says draining.
        await pollFor("the drain to start", async () => {
          const r = await fetch(`${router.base}/ready`)
          const body = (await r.json()) as { status: string }
          return body.status === "draining" ? true : undefined
        })
        // While it drains: new paid work is refused in the caller's dialect, `/ready` says draining.
        const refused = await fetch(`${router.base}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-credit-key": secret },
          body: JSON.stringify({ model: "auto", messages: [{ role: "user", content: "hi" }] })
        })
        expect(refused.status).toBe(503)
        expect(refused.headers.get("retry-after")).toBe("5")
        expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("draining")
        const refusedMessages = await fetch(`${router.base}/v1/messages`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-credit-key": secret },
          body: JSON.stringify({ model: "auto", max_tokens: 10, messages: [{ role: "user", content: "hi" }] })
        })
        expect(refusedMessages.status).toBe(503)
        expect(((await refusedMessages.json()) as { type: string }).type).toBe("error")
        const ready = await fetch(`${router.base}/ready`)
        expect(ready.status).toBe(503)
        expect(((await ready.json()) as { status: string }).status).toBe("draining")

        // The events stream ends, cleanly and at once, when the drain starts (not when the server closes
        // 20 s later, mid-frame); a new subscriber is told to poll the snapshot elsewhere.
        const ended = await eventsEnd
        expect(ended.ended, ended.body.slice(-400)).toBe("cleanly")
        expect(ended.body).toContain('"object":"market.snapshot"')
        expect(router.child.exitCode).toBeNull()
        const lateEvents = await fetch(`${router.base}/v1/market/events`)
        expect(lateEvents.status).toBe(503)
        expect(((await lateEvents.json()) as { error: { code: string } }).error.code).toBe("draining")

        // The short ones finish during the drain; then a second signal cuts the long ones short.
        const shortBodies = await Promise.all(short.map((s) => s.body))
        expect(router.child.exitCode).toBeNull()
        router.child.kill("SIGTERM")
        const longBodies = await Promise.all(long.map((s) => s.body))
        for (const body of [...shortBodies, ...longBodies]) {
          const end = ending(body)
          expect(end.done, body.slice(-400)).toBe(true)
          expect(end.finishReason, body.slice(-400)).toBeDefined()
        }
        for (const body of longBodies) expect(body).toContain('"code":"stopped"')

        const exit = await router.exited
        expect(exit, router.output().slice(-3000)).toEqual({ code: 0, signal: null })
        expect(router.output()).toContain("drain cut short")
        // At least the 20 long streams were in flight when the signal came.
        const inFlight = Number(/draining: .*streams: (\d+)/.exec(router.output())?.[1])
        expect(inFlight).toBeGreaterThanOrEqual(20)
        // A graceful exit stops its own children (the chain) and reaps them before it exits: gone, not
        // even a zombie, at the moment the router is.
        expect([anvilPid].filter(isAlive)).toEqual([])
        // Its other children stop by themselves once it is gone (tsx's esbuild service exits when its stdin
        // closes, i.e. when the router's process has ended): waited for, with a bound.
        expect(await runningAfter(children)).toEqual([])

        // Every request settled: a receipt, a capture of what it delivered, nothing left reserved.
        const settled = await query(
          Effect.gen(function* () {
            const sql = yield* SqlClient.SqlClient
            const receipts = yield* sql<{
              request_id: string
              status: string
              charged: number
              out_tokens: number
            }>`
            SELECT r.request_id, r.body->>'status' AS status, (r.body->>'charged')::int AS charged,
                   (r.body->>'out_tokens')::int AS out_tokens
            FROM receipts r JOIN requests q USING (request_id) WHERE q.status = 'captured'
          `
            const leases = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM capacity_leases`
            const key = yield* sql<{
              reserved: string
            }>`SELECT reserved::text FROM api_keys WHERE key_id = ${keyId}`
            const wallets = yield* sql<{
              reserved: string
            }>`SELECT coalesce(sum(reserved), 0)::text AS reserved FROM wallet_balances`
            return {
              receipts,
              leases: leases[0]!.n,
              keyReserved: key[0]!.reserved,
              walletReserved: wallets[0]!.reserved
            }
          })
        )
        const byId = new Map(settled.receipts.map((r) => [r.request_id, r]))
        shortBodies.forEach((body, i) => {
          expect(byId.get(short[i]!.requestId)?.status, body.slice(-600)).toBe("ok")
        })
        for (const s of long) {
          const receipt = byId.get(s.requestId)
          expect(receipt?.status, s.requestId).toBe("partial")
          expect(receipt!.charged).toBeGreaterThan(0)
          expect(receipt!.out_tokens).toBeGreaterThan(0)
        }
        expect(settled.leases).toBe(0)
        expect(settled.keyReserved).toBe("0")
        expect(settled.walletReserved).toBe("0")
      } catch (error) {
        console.log(router.output().slice(-6000))
        throw error
      } finally {
        if (router.child.exitCode === null) router.child.kill("SIGKILL")
        await router.exited
        await db.drop()
      }
    },
    Math.ceil(240_000 * loadStretch())
  )
})
