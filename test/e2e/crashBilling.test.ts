import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { afterAll, describe, expect, it } from "vitest"
import { fundedKey, keyRows, keyState } from "../support/Keys.ts"
import { freshDatabase, pollFor, startRouterProcess, stopped, waitUntilServing } from "../support/Process.ts"
import { loadStretch } from "../support/Stopwatch.ts"

interface RequestRow {
  readonly request_id: string
  readonly status: string
  readonly charged: string | null
  readonly authorized: string
  readonly metered: { readonly charged: number; readonly final: boolean } | null
}

/**
 * Issue 11 item 5: a router killed (SIGKILL) mid-answer, started again on the same database. The request
 * it was streaming is settled by the restart as soon as the dead instance is known dead: billed what its
 * last meter checkpoint recorded as delivered, the rest released, a receipt issued (D154, D211).
 */
describe("a request open when its router was killed", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-crash-billing-"))
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

  it(
    "is billed its delivered charge on restart, with a receipt, and nothing stays reserved",
    async () => {
      const db = await freshDatabase()
      const env = {
        DATA_DIR: dataDir,
        DATABASE_URL: db.url,
        RECONCILIATION_INTERVAL_SECONDS: "0",
        // Known dead soon after its heartbeat stops (the default is 30 s).
        INSTANCE_DEAD_AFTER_SECONDS: "5"
      }
      const query = <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
        Effect.runPromise(effect.pipe(Effect.provide(db.layer), Effect.orDie))
      const rowsOf = (payer: string) =>
        query(
          Effect.flatMap(
            SqlClient.SqlClient,
            (sql) => sql<RequestRow>`
              SELECT request_id, status, charged::text, authorized::text, metered FROM requests
              WHERE payer = ${payer}`
          )
        )

      const first = await startRouterProcess(env)
      let key: { secret: string; keyId: string; wallet: string }
      let checkpoint: RequestRow
      try {
        await waitUntilServing(first)
        key = await query(fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 }))
        const response = await fetch(`${first.base}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-credit-key": key.secret },
          body: JSON.stringify({
            model: "chat-small",
            stream: true,
            max_tokens: 4000,
            messages: [{ role: "user", content: "Tell me a long story [[sim:long]]" }]
          })
        })
        if (response.status !== 200) throw new Error(`${response.status}: ${await response.text()}`)
        // Read on (the stream is cut by the kill).
        response.text().catch(() => undefined)
        // The stream is under way and its meter has been recorded at least once past the first token.
        checkpoint = await pollFor(
          "a meter checkpoint",
          async () => {
            const row = (await rowsOf(key.wallet))[0]
            return row?.status === "reserved" && row.metered !== null && row.metered.charged > 0
              ? row
              : undefined
          },
          Math.ceil(60_000 * loadStretch())
        )
      } catch (error) {
        console.log(first.output().slice(-5000))
        throw error
      } finally {
        first.child.kill("SIGKILL")
        await first.exited
      }
      // Killed mid-answer: nobody captured it.
      const left = (await rowsOf(key!.wallet))[0]!
      expect(left.status).toBe("reserved")
      const recorded = left.metered!
      expect(recorded.final).toBe(false)
      expect(recorded.charged).toBeGreaterThanOrEqual(checkpoint!.metered!.charged)

      const second = await startRouterProcess(env)
      try {
        await waitUntilServing(second)
        const settled = await pollFor(
          "the restart to settle the dead instance's request",
          async () => {
            const row = (await rowsOf(key!.wallet))[0]
            return row !== undefined && row.status !== "reserved" ? row : undefined
          },
          Math.ceil(60_000 * loadStretch())
        )
        // Billed what was delivered as last recorded; the rest of the worst case went back to the key.
        expect(settled.status).toBe("captured")
        expect(Number(settled.charged)).toBe(recorded.charged)
        expect(Number(settled.charged)).toBeLessThan(Number(settled.authorized))
        const state = await query(keyState(key!.keyId))
        expect([state.reserved, state.walletReserved, state.spent]).toEqual([0, 0, recorded.charged])
        const receipt = (await fetch(`${second.base}/v1/receipts/${settled.request_id}`).then((r) =>
          r.json()
        )) as { receipt: { status: string; charged: number; authorized: number } }
        expect(receipt.receipt).toMatchObject({
          status: "partial",
          charged: recorded.charged,
          authorized: Number(settled.authorized)
        })
        second.child.kill("SIGTERM")
        await second.exited
        // The capture went to the fold queue (D315); the restarted instance folded it into the key's and the
        // owner's rows themselves (its pass, or the last one of its shutdown): nothing left queued.
        expect(await query(keyRows(key!.keyId))).toEqual({
          queued: 0,
          spent: recorded.charged,
          reserved: 0,
          available: 1_000_000_000 - recorded.charged,
          walletReserved: 0
        })
      } catch (error) {
        console.log(second.output().slice(-5000))
        throw error
      } finally {
        await stopped(second)
        await db.drop()
      }
    },
    Math.ceil(300_000 * loadStretch())
  )
})
