import { execFile, fork, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { createHash } from "node:crypto"
import { Effect } from "effect"
import { freePort } from "../src/devnet/EmbeddedPostgres.ts"
import { type ProviderConfig, simulationAccount } from "../src/devnet/fleet/FleetConfig.ts"
import { freshQuote } from "../src/devnet/fleet/Quotes.ts"

const here = new URL(".", import.meta.url).pathname
const run = promisify(execFile)
const TOKEN = "bench-operator"
const db = process.env.DATABASE_URL!
const psql = (q: string) => run("psql", ["-q", db, "-c", q])
const pidsCpu = async (root: number) => {
  const { stdout } = await run("sh", ["-c", `ps -o pid= --ppid ${root}; echo ${root}`])
  let total = 0
  for (const pid of stdout.split(/\s+/).filter(Boolean)) {
    try { const { stdout: s } = await run("cat", [`/proc/${pid}/stat`]); const f = s.split(") ")[1]!.split(" "); const cmd = (await run("cat", [`/proc/${pid}/cmdline`])).stdout; if (!cmd.includes("node")) continue; total += Number(f[11]) + Number(f[12]) } catch {}
  }
  return total * 10 // ms (100 Hz)
}
const main = async () => {
  const mockPort = await Effect.runPromise(freePort)
  const mock = fork(join(here, "mock.mjs"), [String(mockPort)])
  await new Promise((r) => mock.once("message", r))
  for (const workers of (process.env.WORKERSET ?? "1,2").split(",").map(Number)) {
    const port = await Effect.runPromise(freePort)
    const dataDir = mkdtempSync(join(tmpdir(), "svc-cl-"))
    const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env: { ...process.env, WORKERS: String(workers), PORT: String(port), DATA_DIR: dataDir, OPERATOR_TOKEN: TOKEN, SIMULATED_FLEET: "false" }, stdio: ["ignore", "ignore", "ignore"] })
    const router = `http://127.0.0.1:${port}`
    for (let i = 0; i < 240; i++) { await new Promise((r) => setTimeout(r, 500)); if (await fetch(`${router}/health`).then((r) => r.ok, () => false)) break }
    const providers = ["bench-1", "bench-2"].map((id, i): ProviderConfig => ({ providerId: id, dialect: "openai", offers: [{ modelClass: "chat-small", priceIn: 100_000 + i * 1000, priceOut: 400_000 }], ttftMs: 0, tokensPerSecond: 1e6, capacityRps: 100_000, maxContext: 32_000 }))
    for (const p of providers) await (await fetch(`${router}/v1/admin/providers`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` }, body: JSON.stringify({ provider_id: p.providerId, signer: simulationAccount(p.providerId).address, base_url: `http://127.0.0.1:${mockPort}`, dialect: "openai" }) })).text()
    const postQuotes = async () => { for (const p of providers) { const q = await Effect.runPromise(freshQuote(p, p.offers[0]!, simulationAccount(p.providerId))); await (await fetch(`${router}/provider/quotes`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(q) })).text() } }
    await postQuotes(); const refresher = setInterval(postQuotes, 5000)
    await new Promise((r) => setTimeout(r, 2500)) // quote sync to every worker
    const key = `svc_ck_cl_${Date.now()}`; const wallet = "0x00000000000000000000000000000000000c2c2c"
    await psql(`INSERT INTO wallets (wallet, invited) VALUES ('${wallet}', true) ON CONFLICT DO NOTHING; INSERT INTO wallet_balances (wallet, available) VALUES ('${wallet}', 1000000000000) ON CONFLICT (wallet) DO UPDATE SET available = 1000000000000, reserved = 0; INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget) VALUES ('key_cl_${Date.now()}', '${wallet}', 'b', 'credit', '${createHash("sha256").update(key).digest("hex")}', 1000000000000)`)
    const load = async (conns: number, secs: number) => JSON.parse((await run("node", [join(here, "load.mjs"), `${router}/v1/chat/completions`, String(conns), String(secs), "0", JSON.stringify({ "x-credit-key": key })])).stdout)
    await load(20, 4)
    const c0 = await pidsCpu(child.pid!)
    const r = await load(Number(process.env.CONNS ?? 50), Number(process.env.SECS ?? 10))
    const c1 = await pidsCpu(child.pid!)
    const { stdout: pg } = await run("psql", ["-tA", db, "-c", "SELECT sum(xact_commit) FROM pg_stat_database"])
    console.log(`WORKERS=${workers}  rps ${r.rps.toFixed(0)}  p50 ${r.p50.toFixed(1)} ms  p99 ${r.p99.toFixed(1)} ms  router cpu/req ${((c1 - c0) / r.n).toFixed(2)} ms  errors ${r.errors} ${r.firstErr ?? ""}  commits ${pg.trim()}`)
    clearInterval(refresher)
    child.kill("SIGTERM"); await new Promise((r) => child.once("exit", r)); rmSync(dataDir, { recursive: true, force: true })
  }
  mock.kill()
}
main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1) })
