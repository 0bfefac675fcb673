import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { x402Client } from "@x402/fetch"
import { afterAll, describe, expect, it } from "vitest"
import { demoWalletAccounts } from "../../src/chain/DevAccounts.ts"
import { isAlive } from "../../src/process/ChildProcess.ts"
import { officialPayingFetch } from "../support/Pay.ts"
import {
  childrenOf,
  pollFor,
  type RouterProcess,
  runningAfter,
  startRouterProcess,
  stopped,
  waitUntilServing
} from "../support/Process.ts"
import { loadStretch } from "../support/Stopwatch.ts"

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const json = async <A>(url: string) => {
  const response = await fetch(url)
  return { status: response.status, body: (await response.json()) as A }
}

interface Readiness {
  readonly status: string
  readonly reconciliation: {
    readonly status: string
    readonly discrepancies: ReadonlyArray<{ kind: string }>
  }
}

const reconciled = (router: RouterProcess, status: "ok" | "failed") =>
  pollFor(`reconciliation ${status}`, async () => {
    const ready = await json<Readiness>(`${router.base}/ready`)
    return ready.body.reconciliation.status === status ? ready : undefined
  })

const reconciliationGauge = async (router: RouterProcess) => {
  const text = await fetch(`${router.base}/metrics`).then((r) => r.text())
  return Number(/^svc_reconciliation_ok(?:\{[^}]*\})? (\S+)$/m.exec(text)?.[1])
}

/**
 * `npm start` with nothing configured (embedded Postgres and Anvil in DATA_DIR), killed with SIGKILL and
 * started again on the same DATA_DIR: it comes up by itself, and the chain kept what the ledger recorded.
 */
describe("restart after a crash, on the same DATA_DIR", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-restart-"))
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }))
  const env = { DATA_DIR: dataDir, RECONCILIATION_INTERVAL_SECONDS: "2" }

  it(
    "leaves no child behind after SIGKILL, restarts by itself, and ledger and chain still agree",
    async () => {
      const first = await startRouterProcess(env)
      let requestId: string
      let anvilPid: number
      let postgresPid: number
      try {
        await waitUntilServing(first)
        anvilPid = Number(readFileSync(join(dataDir, "chain", "anvil.pid"), "utf8"))
        postgresPid = Number(readFileSync(join(dataDir, "postgres", "postmaster.pid"), "utf8").split("\n")[0])
        expect(childrenOf(first.pid)).toEqual(expect.arrayContaining([anvilPid, postgresPid]))

        // One x402 payment that settles on chain before the crash.
        const account = demoWalletAccounts()[0]!
        const client = new x402Client()
          .register("eip155:31337", new ExactEvmScheme(account))
          .setSpendControls({ allowedAssets: true })
        const paid = await officialPayingFetch(client)(`${first.base}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "auto", max_tokens: 30, messages: [{ role: "user", content: "hi" }] })
        })
        expect(paid.status, await paid.clone().text()).toBe(200)
        requestId = paid.headers.get("x-request-id")!
        await paid.text()
        await pollFor("the settlement to land", async () => {
          const r = await json<{ receipt: { settlement: string } }>(`${first.base}/v1/receipts/${requestId}`)
          return r.body.receipt.settlement === "landed" ? true : undefined
        })
        expect((await reconciled(first, "ok")).body.status).toBe("ready")
      } catch (error) {
        console.log(first.output().slice(-5000))
        throw error
      } finally {
        first.child.kill("SIGKILL")
        await first.exited
      }

      // The kernel stops the router's children when it dies: nothing is left to block the next start.
      // (Orphans are reaped by pid 1, late on some machines: a zombie has stopped.)
      expect(await runningAfter([anvilPid!, postgresPid!], 30_000)).toEqual([])

      const second = await startRouterProcess(env)
      try {
        await waitUntilServing(second)
        const children = childrenOf(second.pid)
        const owned = [
          Number(readFileSync(join(dataDir, "chain", "anvil.pid"), "utf8")),
          Number(readFileSync(join(dataDir, "postgres", "postmaster.pid"), "utf8").split("\n")[0])
        ]
        expect(children).toEqual(expect.arrayContaining(owned))
        expect(second.output()).toContain("taking over DATA_DIR")
        expect(second.output()).toContain("embedded chain resumed")
        const receipt = await json<{ receipt: { settlement: string; status: string } }>(
          `${second.base}/v1/receipts/${requestId}`
        )
        expect(receipt.body.receipt).toMatchObject({ status: "ok", settlement: "landed" })
        // The landed transfer is still on the chain: reconciliation passes after the restart.
        await sleep(2500)
        const ready = await reconciled(second, "ok")
        expect(ready.body.status).toBe("ready")
        expect(await reconciliationGauge(second)).toBe(1)
        second.child.kill("SIGTERM")
        expect(await second.exited).toEqual({ code: 0, signal: null })
        // A graceful exit stops and reaps its database and chain before it exits (not even a zombie is left);
        // its other children (tsx's esbuild service) stop by themselves once it is gone.
        expect(owned.filter(isAlive)).toEqual([])
        expect(await runningAfter(children)).toEqual([])
      } catch (error) {
        console.log(second.output().slice(-5000))
        throw error
      } finally {
        await stopped(second)
      }

      // A chain that lost its state (its files deleted) is deployed afresh, and the mismatch shows.
      for (const file of ["anvil-state.json", "anvil-state.backup.json"]) {
        rmSync(join(dataDir, "chain", file), { force: true })
      }
      const third = await startRouterProcess(env)
      try {
        await waitUntilServing(third)
        expect(third.output()).toContain("the embedded chain lost its state")
        const ready = await reconciled(third, "failed")
        expect(ready.body.reconciliation.discrepancies.map((d) => d.kind)).toContain("settlement_tx_missing")
        // Not on mainnet: still ready (spec 7), with the failure in the body and in /metrics.
        expect(ready).toMatchObject({ status: 200, body: { status: "ready" } })
        expect(await reconciliationGauge(third)).toBe(0)
      } catch (error) {
        console.log(third.output().slice(-5000))
        throw error
      } finally {
        third.child.kill("SIGTERM")
        await stopped(third)
      }
    },
    Math.ceil(300_000 * loadStretch())
  )
})
