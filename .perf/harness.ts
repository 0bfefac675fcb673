import { fork, execFile } from "node:child_process"
import { promisify } from "node:util"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../src/chain/Chain.ts"
import { DatabaseLive } from "../src/db/Database.ts"
import { freePort } from "../src/devnet/EmbeddedPostgres.ts"
import { type ProviderConfig, simulationAccount } from "../src/devnet/fleet/FleetConfig.ts"
import { freshQuote } from "../src/devnet/fleet/Quotes.ts"
import { HttpServerLive } from "../src/http/Server.ts"
import { hashSecret } from "../src/payment/Keys.ts"
import { ServicesLive } from "../src/Router.ts"
import { RouterConfig } from "../src/RouterConfig.ts"

const TOKEN = "bench-operator"
const here = new URL(".", import.meta.url).pathname
const run = promisify(execFile)
const load = async (url: string, conns: number, seconds: number, rate: number, headers: Record<string, string> = {}) => {
  const c0 = process.cpuUsage()
  const { stdout } = await run("node", [join(here, "load.mjs"), url, String(conns), String(seconds), String(rate), JSON.stringify(headers)])
  const c = process.cpuUsage(c0)
  const r = JSON.parse(stdout)
  r.routerCpuMsPerReq = (c.user + c.system) / 1000 / Math.max(1, r.n)
  return r
}

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-perf-"))
  const port = await Effect.runPromise(freePort)
  const mockPort = await Effect.runPromise(freePort)
  const mock = fork(join(here, "mock.mjs"), [String(mockPort)])
  await new Promise((r) => mock.once("message", r))
  const mockUrl = `http://127.0.0.1:${mockPort}`
  const config = RouterConfig.layerTest({ port, publicUrl: `http://127.0.0.1:${port}`, operatorToken: Redacted.make(TOKEN), dataDir })
  const infrastructure = Layer.mergeAll(DatabaseLive, Chain.layer).pipe(Layer.provideMerge(config))
  const runtime = ManagedRuntime.make(HttpServerLive.pipe(Layer.provideMerge(ServicesLive), Layer.provideMerge(infrastructure)))
  try {
    await runtime.runPromise(Effect.service(Chain))
    const router = `http://127.0.0.1:${port}`
    const providers = ["bench-1", "bench-2"].map((id, i): ProviderConfig => ({
      providerId: id, dialect: "openai", offers: [{ modelClass: "chat-small", priceIn: 100_000 + i * 1000, priceOut: 400_000 }],
      ttftMs: 0, tokensPerSecond: 1e6, capacityRps: 100_000, maxContext: 32_000
    }))
    for (const p of providers) {
      const r = await fetch(`${router}/v1/admin/providers`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
        body: JSON.stringify({ provider_id: p.providerId, signer: simulationAccount(p.providerId).address, base_url: mockUrl, dialect: "openai" }) })
      await r.text()
    }
    const postQuotes = async () => { for (const p of providers) {
      const quote = await Effect.runPromise(freshQuote(p, p.offers[0]!, simulationAccount(p.providerId)))
      await (await fetch(`${router}/provider/quotes`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(quote) })).text()
    } }
    await postQuotes()
    const refresher = setInterval(postQuotes, 5_000)
    const creditKey = `svc_ck_bench_${Date.now()}`
    await runtime.runPromise(Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const wallet = "0x00000000000000000000000000000000000be4c4"
      yield* sql`INSERT INTO wallets (wallet, invited) VALUES (${wallet}, true) ON CONFLICT DO NOTHING`
      yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${wallet}, 1000000000000) ON CONFLICT (wallet) DO UPDATE SET available = 1000000000000`
      yield* sql`INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget) VALUES (${'key_bench_' + Date.now()}, ${wallet}, 'bench', 'credit', ${hashSecret(creditKey)}, 1000000000000)`
    }))
    const key = { "x-credit-key": creditKey }
    const routed = `${router}/v1/chat/completions`
    const direct = `${mockUrl}/v1/chat/completions`
    const secs = Number(process.env.SECS ?? 8)
    console.log("warmup", JSON.stringify(await load(routed, 20, 3, 0, key)))
    const { Session } = await import("node:inspector/promises")
    const session = new Session()
    if (process.env.PROFILE) { session.connect(); await session.post("Profiler.enable"); await session.post("Profiler.start") }
    const only = (process.env.ONLY ?? "direct50,key50,key500,direct100,key100").split(",")
    for (const name of only) {
      const [target, n] = [name.replace(/[0-9]+$/, ""), Number(name.match(/[0-9]+$/)![0])]
      const url = target === "direct" ? direct : routed
      const r = n === 100 ? await load(url, 0, secs, 100, target === "key" ? key : {}) : await load(url, n, secs, 0, target === "key" ? key : {})
      console.log(name.padEnd(10), `rps ${r.rps.toFixed(0).padStart(6)}  p50 ${r.p50.toFixed(2).padStart(8)}  p99 ${r.p99.toFixed(2).padStart(8)}  cpu/req ${r.routerCpuMsPerReq.toFixed(3)}ms  err ${r.errors} ${r.firstErr ?? ""}`)
    }
    if (process.env.PROFILE) { const { profile } = await session.post("Profiler.stop"); (await import("node:fs")).writeFileSync(process.env.PROFILE, JSON.stringify(profile)) }
    clearInterval(refresher)
  } finally {
    await runtime.dispose(); mock.kill(); rmSync(dataDir, { recursive: true, force: true })
  }
}
main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1) })
