/**
 * `npm run soak`: a few thousand mixed paid calls across two router instances on one database and one
 * chain, with the faults a deployment meets, then the books: no base unit lost or double-spent.
 *
 * Starts, each as a process of its own (loopback only): Postgres (embedded, in a temporary folder; or a
 * fresh database on the server of `DATABASE_URL`), one Anvil with the contracts deployed, two routers as
 * `npm start` runs them (instances of that external deployment, `EPOCH_SECONDS` short), and the simulated
 * provider fleet (`npm run providers`). Funds credit keys by x402 deposits, then drives `SOAK_REQUESTS`
 * calls (x402 and credit keys, chat and messages, streamed and not, provider faults, client hang-ups) from
 * `SOAK_CONCURRENCY` clients (x402 `upto` too, `Idempotency-Key` repeats, budget sessions: bench/soak/Traffic.ts),
 * and meanwhile: a database stall, a SIGKILL of instance B and its restart, a chain stall, a SIGTERM of
 * instance B (graceful drain, audited at once: Audit.ts `drained`) and its restart. Then waits until
 * every epoch with receipts has closed and every refund is settled, lets reconciliation run once more,
 * audits ledger, chain and clients (`Audit.ts`), stops everything and prints one table. Exits 1 when a
 * money figure is not zero, work is left open, a child process outlived the run, or reconciliation is not
 * `ok`.
 *
 * Knobs (env or `--name=value`): SOAK_REQUESTS (3000), SOAK_CONCURRENCY (24), SOAK_SECONDS (traffic
 * bound, 300), SOAK_EPOCH_SECONDS (20), SOAK_SETTLE_SECONDS (bound on the wait for settlement, 240),
 * SOAK_DB_STALL_MS (12000: longer than the instances' 10 s INSTANCE_DEAD_AFTER_SECONDS, so a stall of the
 * database must not pass for a death, D252), SOAK_CHAIN_STALL_MS (5000), SOAK_SEED (the plan's random seed),
 * SOAK_KEEP (keep the folder and database).
 */
import { chmodSync, mkdtempSync, rmSync } from "node:fs"
import { availableParallelism, loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import { createPermit2ApprovalTx } from "@x402/evm/upto/client"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Address } from "viem"
import { createWalletClient, http } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { isRunning } from "../../src/process/ChildProcess.ts"
import { tree } from "../load/Proc.ts"
import { Children, freePort, post, routerArgs, sleep } from "../support/Children.ts"
import { type FundedKey, insertCreditKey } from "../support/CreditKeys.ts"
import { runMain } from "../support/RunMain.ts"
import { audit, balances, type Drained, drained, isSettled, type OpenWork, openWork } from "./Audit.ts"
import { type Infra, startInfra } from "./Infra.ts"
import { deposit, type Outcome, planRequest, type SignedAuthorization, send, x402Payers } from "./Traffic.ts"

const knob = (name: string, fallback: number) => {
  const flag = process.argv.find((arg) => arg.startsWith(`--${name.toLowerCase().replace(/^soak_/, "")}=`))
  const raw = flag?.split("=")[1] ?? process.env[name]
  const value = raw === undefined ? fallback : Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number (got ${raw})`)
  return value
}
const REQUESTS = knob("SOAK_REQUESTS", 3000)
const CONCURRENCY = Math.max(1, knob("SOAK_CONCURRENCY", 24))
const TRAFFIC_SECONDS = knob("SOAK_SECONDS", 300)
const EPOCH_SECONDS = Math.max(4, knob("SOAK_EPOCH_SECONDS", 20))
const SETTLE_SECONDS = knob("SOAK_SETTLE_SECONDS", 240)
const DB_STALL_MS = knob("SOAK_DB_STALL_MS", 12_000)
const CHAIN_STALL_MS = knob("SOAK_CHAIN_STALL_MS", 5_000)
const SEED = knob("SOAK_SEED", Date.now() % 1_000_000)
const TOKEN = "soak-operator"
const log = (line: string) =>
  process.stderr.write(`[soak ${new Date().toISOString().slice(11, 19)}] ${line}\n`)

/** A small seeded generator (mulberry32): the same seed plans the same calls. */
const seeded = (seed: number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const children = new Children(log)
children.stopOnSignals()

interface Instance {
  readonly name: string
  readonly base: string
  readonly env: Record<string, string>
  readonly logFile: string
  child: ReturnType<Children["start"]>
  up: boolean
}

const ready = async (base: string) => (await fetch(`${base}/ready`)).ok

const bookReady = async (base: string) => {
  const book = (await (await fetch(`${base}/v1/market/book`)).json()) as {
    classes: Array<{ model_class: string; depth: number }>
  }
  return (book.classes.find((c) => c.model_class === "chat-small")?.depth ?? 0) > 0
}

/** The chaos, at fractions of the calls done: each once, in this order. */
interface Chaos {
  readonly at: number
  readonly name: string
  readonly run: () => Promise<string>
}

const main = async () => {
  const started = Date.now()
  // The soak's own helpers (tsx's esbuild service), there before anything was started: not children left.
  const own = new Set(tree(process.pid).map((stat) => stat.pid))
  const dataDir = mkdtempSync(join(tmpdir(), "svc-soak-"))
  chmodSync(dataDir, 0o755)
  log(`seed ${SEED}; ${REQUESTS} calls from ${CONCURRENCY} clients; logs and data in ${dataDir}`)
  if (process.env.SOAK_KEEP === undefined)
    children.atSignalExit(() => rmSync(dataDir, { recursive: true, force: true }))
  let infra: Infra | undefined
  let left: Array<string> = []
  try {
    infra = await startInfra(join(dataDir, "db"), process.env.DATABASE_URL || undefined)
    const shared = infra
    log(`database and chain up (${shared.chainEnv.RPC_URL})`)

    const instance = async (name: string): Promise<Instance> => {
      const port = await freePort()
      const env = {
        PORT: String(port),
        HOST: "127.0.0.1",
        DATA_DIR: join(dataDir, name),
        DATABASE_URL: shared.databaseUrl,
        ...shared.chainEnv,
        OPERATOR_TOKEN: TOKEN,
        SIMULATED_FLEET: "false",
        EPOCH_SECONDS: String(EPOCH_SECONDS),
        RECONCILIATION_INTERVAL_SECONDS: "10",
        INSTANCE_DEAD_AFTER_SECONDS: "10",
        DRAIN_TIMEOUT_SECONDS: "5"
      }
      const logFile = join(dataDir, `router-${name}.log`)
      const child = children.start(`router ${name}`, routerArgs(), env, logFile)
      return { name, base: `http://127.0.0.1:${port}`, env, logFile, child, up: false }
    }
    // One after the other: the first migrates the database, the second finds it migrated.
    const a = await instance("a")
    await children.waitFor("router a", () => ready(a.base), 300)
    a.up = true
    const b = await instance("b")
    await children.waitFor("router b", () => ready(b.base), 300)
    b.up = true
    children.start(
      "fleet",
      ["--import", "tsx", "src/devnet/fleetMain.ts"],
      { ROUTER_URL: a.base, OPERATOR_TOKEN: TOKEN },
      join(dataDir, "fleet.log")
    )
    await children.waitFor(
      "the fleet's quotes",
      async () => (await bookReady(a.base)) && bookReady(b.base),
      120
    )
    log(
      `routers a ${a.base} and b ${b.base} serving, fleet quoting (${((Date.now() - started) / 1000).toFixed(0)} s)`
    )

    // The last two demo wallets own the credit keys, funded by x402 deposits (tokens the treasury holds);
    // the others pay per call with x402.
    const accounts = shared.demoWallets.map((w) => privateKeyToAccount(w.privateKey!))
    const payers = x402Payers(accounts, `eip155:${shared.chainEnv.CHAIN_ID}`)
    const watched: Array<string> = [
      ...accounts.map((acc) => acc.address.toLowerCase()),
      shared.treasury.toLowerCase(),
      shared.routerSigner.toLowerCase()
    ]
    // Before anything is paid: the audit follows every token from here.
    const before = await balances(shared.publicClient, shared.token, watched)
    const setupSigned: Array<SignedAuthorization> = []
    const owners = accounts.slice(-2).map((account) => account.address.toLowerCase())
    for (const [i, owner] of owners.entries()) {
      await post(
        `${a.base}/v1/admin/wallets`,
        { wallet: owner, invited: true },
        { authorization: `Bearer ${TOKEN}` }
      )
      await deposit(a.base, payers.at(-2 + i)!, "5", setupSigned)
    }
    const funded = () =>
      shared.sql(
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          return yield* sql<{
            wallet: string
          }>`SELECT wallet FROM wallet_balances WHERE lower(wallet) IN ${sql.in(owners)} AND available > 0`
        })
      )
    await children.waitFor("the deposits to land", async () => (await funded()).length === owners.length, 120)
    const keys: Array<FundedKey> = []
    for (const [i, { wallet }] of (await funded()).entries()) {
      for (let k = 0; k < 3; k++) {
        keys.push(
          await insertCreditKey(shared.databaseUrl, {
            keyId: `key_soak_${i}_${k}`,
            wallet,
            amount: 5_000_000
          })
        )
      }
    }
    // The x402 payers also pay with `upto`, each with its own official client: Permit2 approved once.
    const uptoAccounts = accounts.slice(0, -2)
    for (const account of uptoAccounts) {
      const wallet = createWalletClient({
        account,
        chain: shared.publicClient.chain,
        transport: http(shared.chainEnv.RPC_URL)
      })
      await shared.publicClient.waitForTransactionReceipt({
        hash: await wallet.sendTransaction({ ...createPermit2ApprovalTx(shared.token), chain: null })
      })
    }
    const uptoPayers = x402Payers(uptoAccounts, `eip155:${shared.chainEnv.CHAIN_ID}`, "upto")
    const clients = { payers: payers.slice(0, -2), uptoPayers, keys }

    // The calls, and the chaos meanwhile
    const random = seeded(SEED)
    const plans = Array.from({ length: REQUESTS }, (_, id) => planRequest(id, random))
    const instances = [a, b]
    const outcomes: Array<Outcome> = []
    const events: Array<string> = []
    let restart: Promise<void> = Promise.resolve()
    let drain: Drained | undefined
    const restartB = (why: string, since: number) => {
      b.child = children.start("router b", routerArgs(), b.env, b.logFile)
      restart = children
        .waitFor(`router b after its ${why}`, () => ready(b.base), 300)
        .then(() => {
          b.up = true
          events.push(`router b ready again ${((Date.now() - since) / 1000).toFixed(0)} s after ${why}`)
        })
    }
    const chaos: Array<Chaos> = [
      { at: 0.2, name: "database stall", run: () => shared.stallDatabase(DB_STALL_MS) },
      {
        at: 0.4,
        name: "SIGKILL of router b",
        run: async () => {
          b.up = false
          children.expectExit(b.child)
          b.child.kill("SIGKILL")
          await new Promise((done) => b.child.once("exit", done))
          restartB("SIGKILL", Date.now())
          return "SIGKILL, restarted on the same port and DATA_DIR"
        }
      },
      { at: 0.65, name: "chain stall", run: () => shared.stallChain(CHAIN_STALL_MS) },
      {
        at: 0.8,
        name: "SIGTERM of router b",
        run: async () => {
          // Restarted after the SIGKILL: wait until it serves again and has calls in flight to drain.
          await restart
          const from = done
          const until = Date.now() + 15_000
          while (done < from + 2 * CONCURRENCY && Date.now() < until) await sleep(100)
          b.up = false
          children.expectExit(b.child)
          const termAt = Date.now()
          b.child.kill("SIGTERM")
          const code = await new Promise<number | null>((done) => b.child.once("exit", (c) => done(c)))
          const drainMs = Date.now() - termAt
          // What the drained instance left, read before anything else could tidy it.
          drain = await drained(shared.sql)
          restartB("SIGTERM", termAt)
          return `SIGTERM, exited ${code} after ${(drainMs / 1000).toFixed(1)} s; restarted`
        }
      }
    ]
    let next = 0
    let done = 0
    const trafficDeadline = Date.now() + TRAFFIC_SECONDS * 1000
    const chaosLoop = (async () => {
      for (const step of chaos) {
        while (done < step.at * REQUESTS && Date.now() < trafficDeadline) await sleep(100)
        if (Date.now() >= trafficDeadline) return
        log(`${step.name} at ${done} calls done`)
        const at = done
        const what = await step.run().catch((error) => `FAILED: ${String(error).slice(0, 200)}`)
        events.push(`${step.name} at call ${at}: ${what}`)
      }
    })()
    let turn = 0
    const target = () => {
      const up = instances.filter((i) => i.up)
      return (up[turn++ % up.length] ?? a).base
    }
    const client = async () => {
      while (next < plans.length && Date.now() < trafficDeadline) {
        const plan = plans[next++]!
        outcomes.push(...(await send(plan, target, clients)))
        done++
        if (done % 250 === 0) log(`${done} calls done`)
      }
    }
    const trafficStarted = Date.now()
    await Promise.all(Array.from({ length: CONCURRENCY }, client))
    const trafficSeconds = (Date.now() - trafficStarted) / 1000
    await chaosLoop
    log(
      `traffic done: ${done} plans, ${outcomes.length} calls in ${trafficSeconds.toFixed(0)} s; waiting for router b`
    )
    await restart

    // Settlement: every epoch with receipts closed, nothing reserved or owed.
    const settleDeadline = Date.now() + SETTLE_SECONDS * 1000
    let open: OpenWork = await openWork(shared.sql)
    while (!isSettled(open) && Date.now() < settleDeadline) {
      await sleep(2_000)
      open = await openWork(shared.sql)
    }
    const settledIn = (Date.now() - trafficStarted) / 1000 - trafficSeconds
    log(`settlement ${isSettled(open) ? "complete" : "NOT complete"}: ${JSON.stringify(open)}`)
    // Reconciliation: a run that started after the settlement.
    const since = new Date()
    let reconciliation = { status: "none", kinds: "" }
    const reconcileDeadline = Date.now() + 60_000
    while (Date.now() < reconcileDeadline) {
      const [run] = await shared.sql(
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          return yield* sql<{ status: string; kinds: string | null }>`
            SELECT status, (SELECT string_agg(DISTINCT d->>'kind', ',') FROM jsonb_array_elements(discrepancies) d) AS kinds
            FROM reconciliation_runs WHERE started_at > ${since} AND status <> 'running'
            ORDER BY id DESC LIMIT 1`
        })
      )
      if (run !== undefined) {
        reconciliation = { status: run.status, kinds: run.kinds ?? "" }
        break
      }
      await sleep(1_000)
    }
    const money = await audit({
      query: shared.sql,
      client: shared.publicClient,
      token: shared.token,
      treasury: shared.treasury as Address,
      routerSigner: shared.routerSigner as Address,
      signed: [...setupSigned, ...outcomes.flatMap((o) => o.signed)],
      keys,
      requestIdsSeen: outcomes.filter((o) => o.status === 200 && o.requestId).map((o) => o.requestId!),
      requestIdsServedWhole: outcomes.filter((o) => o.complete && o.requestId).map((o) => o.requestId!),
      singlePlans: [...new Set(outcomes.filter((o) => o.plan.turns === 0).map((o) => o.plan.id))],
      before
    })

    // Stop everything; then count what outlived it.
    const ours = tree(process.pid).filter((stat) => !own.has(stat.pid))
    await children.stopAll()
    await infra.close()
    infra = undefined
    const stopDeadline = Date.now() + 15_000
    while (ours.some((stat) => isRunning(stat.pid)) && Date.now() < stopDeadline) await sleep(250)
    left = ours.filter((stat) => isRunning(stat.pid)).map((stat) => `${stat.comm} ${stat.pid}`)

    // Whatever the audit could not square, told by the plan that met it.
    const byRequest = new Map(outcomes.filter((o) => o.requestId).map((o) => [o.requestId!, o]))
    const told = (o: Outcome | undefined) =>
      o === undefined
        ? "no client saw it"
        : `plan ${o.plan.id} ${o.role} ${o.plan.pay} ${o.plan.api}${o.plan.stream ? " stream" : ""}${o.plan.idempotency ? ` idem:${o.plan.idempotency}` : ""}${o.plan.hangUpAfterMs !== undefined ? ` hang-up ${o.plan.hangUpAfterMs} ms` : ""} on ${o.instance.slice(-5)}`
    const diagnosis = [
      ...money.servedFreeIds
        .slice(0, 5)
        .map((id) => `${id} served whole, charged nothing: ${told(byRequest.get(id))}`),
      ...outcomes
        .filter((o) => o.role === "opening" && o.status !== 200)
        .slice(0, 3)
        .map((o) => `session opening ${o.status} ${o.code ?? ""}: ${told(o)}`),
      ...outcomes
        .filter((o) => o.role === "close" && o.status !== 200)
        .slice(0, 3)
        .map((o) => `session close ${o.status} ${o.code ?? ""}: ${told(o)}`)
    ]
    printTable({
      diagnosis,
      drain,
      outcomes,
      trafficSeconds,
      settledIn,
      open,
      money,
      reconciliation,
      events,
      left,
      signed: outcomes.reduce((n, o) => n + o.signed.length, 0),
      totalSeconds: (Date.now() - started) / 1000
    })
    const failed =
      money.lost !== 0n ||
      money.doubleSpent !== 0n ||
      money.unpaidCharges !== 0n ||
      money.ledgerVsChain !== 0n ||
      money.nonceReuse !== 0 ||
      money.unknownAuthorizations !== 0 ||
      money.unknownRequests !== 0 ||
      money.servedFree !== 0 ||
      money.uptoMismatch !== 0 ||
      money.chargedTwice !== 0 ||
      money.sessionMismatch !== 0 ||
      drain === undefined ||
      !drain.stopped ||
      drain.reserved + drain.leases + drain.withoutReceipt !== 0 ||
      !isSettled(open) ||
      left.length > 0 ||
      reconciliation.status !== "ok"
    return failed ? 1 : 0
  } finally {
    await children.stopAll()
    if (infra !== undefined) await infra.close().catch(() => undefined)
    if (process.env.SOAK_KEEP === undefined) rmSync(dataDir, { recursive: true, force: true })
    else log(`kept ${dataDir}`)
  }
}

const printTable = (r: {
  diagnosis: ReadonlyArray<string>
  drain: Drained | undefined
  outcomes: ReadonlyArray<Outcome>
  trafficSeconds: number
  settledIn: number
  open: OpenWork
  money: Awaited<ReturnType<typeof audit>>
  reconciliation: { status: string; kinds: string }
  events: ReadonlyArray<string>
  left: ReadonlyArray<string>
  signed: number
  totalSeconds: number
}) => {
  const count = (f: (o: Outcome) => boolean) => r.outcomes.filter(f).length
  const byStatus = new Map<string, number>()
  for (const o of r.outcomes) {
    if (o.complete || o.hungUp) continue
    const label =
      o.status === 0
        ? "no answer (connection cut)"
        : o.status === 200
          ? "200, answer cut short (provider dropped)"
          : `${o.status}${o.code ? ` ${o.code}` : ""}`
    byStatus.set(label, (byStatus.get(label) ?? 0) + 1)
  }
  const row = (name: string, value: string | number | bigint) => `  ${name.padEnd(44)} ${String(value)}`
  const lines = [
    "",
    `Soak: 2 router instances, one database, one chain; ${availableParallelism()} cores, load average ${loadavg()[0]!.toFixed(1)} at the end.`,
    ...r.events.map((e) => `  - ${e}`),
    "",
    row("requests", r.outcomes.length),
    row(
      "  x402 exact / x402 upto / credit key",
      `${count((o) => o.plan.pay === "x402")} / ${count((o) => o.plan.pay === "upto")} / ${count((o) => o.plan.pay === "key")}`
    ),
    row(
      "  idempotent pairs (after hang-up / alongside)",
      `${count((o) => o.plan.idempotency === "after-hang-up" && o.role === "repeat")} / ${count((o) => o.plan.idempotency === "alongside" && o.role === "repeat")}`
    ),
    row(
      "    repeats answered 200 / 409 / other",
      `${count((o) => o.role === "repeat" && o.status === 200)} / ${count((o) => o.role === "repeat" && o.status === 409)} / ${count((o) => o.role === "repeat" && o.status !== 200 && o.status !== 409)}`
    ),
    row(
      "  sessions opened / turns served / closed",
      `${count((o) => o.role === "opening" && o.status === 200)} / ${count((o) => o.role === "turn" && o.complete)} / ${count((o) => o.role === "close" && o.status === 200)}`
    ),
    row(
      "  chat / messages",
      `${count((o) => o.plan.api === "chat")} / ${count((o) => o.plan.api === "messages")}`
    ),
    row("  streamed / whole", `${count((o) => o.plan.stream)} / ${count((o) => !o.plan.stream)}`),
    row("  x402 authorizations signed", r.signed),
    row(
      "ok (200, whole answer)",
      count((o) => o.complete)
    ),
    row(
      "hang-ups (client aborted)",
      count((o) => o.hungUp)
    ),
    row(
      "provider faults asked (error/drop/slow)",
      `${count((o) => o.plan.fault === "error")}/${count((o) => o.plan.fault === "drop")}/${count((o) => o.plan.fault === "slow")}`
    ),
    "  errors by status:",
    ...[...byStatus.entries()].sort((x, y) => y[1] - x[1]).map(([label, n]) => row(`    ${label}`, n)),
    "",
    row("base units lost", r.money.lost),
    row("base units double-spent", r.money.doubleSpent),
    row("base units charged, payment never moved", r.money.unpaidCharges),
    row("base units ledger ≠ chain", r.money.ledgerVsChain),
    row("nonces used twice", r.money.nonceReuse),
    row("authorizations no client signed", r.money.unknownAuthorizations),
    row("served calls unknown to the ledger", r.money.unknownRequests),
    row("whole answers charged nothing", r.money.servedFree),
    row(
      "upto settled ≠ metered charge or > ceiling",
      `${r.money.uptoMismatch} (of ${r.money.uptoSettled} settled)`
    ),
    row(
      "plans charged twice (idempotency)",
      `${r.money.chargedTwice} (${r.money.chargedTwiceUnits} base units)`
    ),
    row(
      "sessions spent ≠ Σ turns or > budget",
      `${r.money.sessionMismatch} (of ${r.money.sessions}, ${r.money.sessionTurns} turns)`
    ),
    row(
      "SIGTERM-drained b: reserved/leases/no receipt",
      r.drain === undefined
        ? "NOT MEASURED"
        : `${r.drain.reserved}/${r.drain.leases}/${r.drain.withoutReceipt} of ${r.drain.admitted} admitted (${r.drain.unsigned} unsigned yet)${r.drain.stopped ? "" : " (NOT marked stopped)"}`
    ),
    row("reservations left open", r.open.reserved),
    row("capacity leases left", r.open.leases),
    row(
      "other open work (auth/refund/payout/tx/idem/session)",
      `${r.open.authorizations}/${r.open.refunds}/${r.open.payouts}/${r.open.outgoing}/${r.open.idempotency}/${r.open.sessionsOpen}`
    ),
    row("epochs with receipts not closed", r.open.epochsOpen),
    row("child processes left", `${r.left.length}${r.left.length > 0 ? ` (${r.left.join(", ")})` : ""}`),
    row(
      "reconciliation",
      `${r.reconciliation.status}${r.reconciliation.kinds ? ` (${r.reconciliation.kinds})` : ""}`
    ),
    "",
    row(
      "traffic seconds / settlement seconds after",
      `${r.trafficSeconds.toFixed(0)} / ${r.settledIn.toFixed(0)}`
    ),
    row("total seconds", r.totalSeconds.toFixed(0)),
    ...(r.money.notes.length > 0 ? ["", "Notes:", ...r.money.notes.map((n) => `  ${n}`)] : []),
    ...r.diagnosis.map((line) => `  ${line}`),
    ""
  ]
  process.stdout.write(lines.join("\n"))
}

runMain(main, 2)
