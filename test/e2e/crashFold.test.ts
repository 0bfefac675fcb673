import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { afterAll, describe, expect, it } from "vitest"
import { fundedKey, keyRows, keySettled, keyState } from "../support/Keys.ts"
import {
  freshDatabase,
  pollFor,
  startRouterProcess,
  waitUntilServing,
  whileRunning
} from "../support/Process.ts"
import { loadStretch } from "../support/Stopwatch.ts"

/**
 * D315: a router killed (SIGKILL) after capturing credit requests and before folding them. The captures are
 * queued in the database, so nothing is lost: readers count them meanwhile, and the restart folds them
 * into the key's and the owner's rows, once.
 */
describe("credit captures a killed router had not folded", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-crash-fold-"))
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

  it(
    "stay reserved in the rows, count for readers, and are folded by the restart",
    async () => {
      const db = await freshDatabase()
      const env = { DATA_DIR: dataDir, DATABASE_URL: db.url, RECONCILIATION_INTERVAL_SECONDS: "0" }
      const query = <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
        Effect.runPromise(effect.pipe(Effect.provide(db.layer), Effect.orDie))
      const balance = 1_000_000_000
      try {
        // The first instance's pass runs at its start and then not for an hour: what it captures stays queued.
        const first = await startRouterProcess({ ...env, CREDIT_FOLD_EVERY_MS: "3600000" })
        const key = await whileRunning(first, "kill", async () => {
          await waitUntilServing(first)
          const key = await query(fundedKey({ budget: balance, balance }))
          for (let i = 0; i < 3; i++) {
            const response = await fetch(`${first.base}/v1/chat/completions`, {
              method: "POST",
              headers: { "content-type": "application/json", "x-credit-key": key.secret },
              body: JSON.stringify({
                model: "chat-small",
                max_tokens: 16,
                messages: [{ role: "user", content: "hi" }]
              })
            })
            expect(response.status, await response.text()).toBe(200)
          }
          // A reply can precede its capture's commit (D534): the three captures are written before the kill.
          await query(keySettled(key.keyId))
          return key
        })
        const [captured] = await query(
          Effect.flatMap(
            SqlClient.SqlClient,
            (sql) => sql<{ n: number; charged: string; authorized: string }>`
              SELECT count(*)::int AS n, sum(charged)::text AS charged, sum(authorized)::text AS authorized
              FROM requests WHERE payer = ${key.wallet} AND status = 'captured'`
          )
        )
        expect(captured!.n).toBe(3)
        const charged = Number(captured!.charged)
        const authorized = Number(captured!.authorized)
        expect(charged).toBeLessThan(authorized)
        // Killed before a fold: the rows still hold every worst case; readers count the queue.
        expect(await query(keyRows(key.keyId))).toEqual({
          queued: 3,
          spent: 0,
          reserved: authorized,
          available: balance - authorized,
          walletReserved: authorized
        })
        const settled = { spent: charged, reserved: 0, available: balance - charged, walletReserved: 0 }
        expect(await query(keyState(key.keyId))).toEqual({ budget: balance, ...settled })

        const second = await startRouterProcess(env)
        await whileRunning(second, "drain", async () => {
          await waitUntilServing(second)
          const folded = await pollFor(
            "the restart to fold the killed instance's captures",
            async () => {
              const now = await query(keyRows(key.keyId))
              return now.queued === 0 ? now : undefined
            },
            Math.ceil(30_000 * loadStretch())
          )
          expect(folded).toEqual({ queued: 0, ...settled })
        })
      } finally {
        await db.drop()
      }
    },
    Math.ceil(300_000 * loadStretch())
  )
})
