/**
 * `npm run bench:settlement`: what settling captured x402 authorizations costs the database, counted
 * per authorization settled (issue 12). One embedded Postgres with `pg_stat_statements`, one Anvil per tree
 * (`SETTLEMENT_BLOCK_TIME`, default 1 s
 * between blocks, as the embedded chain mines under load, D450). Each round queues `SETTLEMENT_COUNT`
 * (default 64: two claims) signed `exact` authorizations with their pending receipts, runs settlement passes
 * one after another until every one has landed and its receipt is signed, and counts the database's work in
 * between: top-level statements (and nested ones: trigger bodies), commits (`pg_stat_database.xact_commit`:
 * explicit transactions and statements run on their own alike), and the commits that wrote (transaction ids
 * assigned: each one a WAL flush). About 25 s a round and tree, most of it waiting for Postgres to publish
 * its transaction counts.
 *
 * `SETTLEMENT_BEFORE=<src folder>` (e.g. `git archive <commit> src | tar -x -C /tmp/before`, with a
 * `node_modules` link beside it) runs that tree's settlement beside this one, in one Postgres, rounds
 * interleaved (before, this, before, this, ...): counts, not times, so the shared machine's load does not
 * move them. `SETTLEMENT_ROUNDS` (default 3). Background work of the ledger unrelated to settlement (the
 * credit fold's idle passes, the receipt sweep) is left out, and named. Asserts nothing.
 */
import { appendFileSync, chmodSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { ConfigProvider, type Context, Effect, Exit, Layer, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { privateKeyToAccount } from "viem/accounts"
import { startEmbeddedPostgres } from "../src/devnet/EmbeddedPostgres.ts"
import { pendingReceiptBody } from "../test/support/SeededReceipt.ts"
import { runMain } from "./support/RunMain.ts"

const COUNT = Number(process.env.SETTLEMENT_COUNT ?? 64)
const ROUNDS = Number(process.env.SETTLEMENT_ROUNDS ?? 3)
const BLOCK_TIME = process.env.SETTLEMENT_BLOCK_TIME ?? "1"
const log = (line: string) => process.stderr.write(`[bench:settlement] ${line}\n`)

/** Statements the ledger's own background loops run whatever settlement does. */
const background = (query: string) =>
  query.includes("credit_unfolded") ||
  query.includes("bench probe") ||
  /SELECT body FROM receipts\s+WHERE signature IS NULL/.test(query)

/** One tree's modules: this worktree's `src`, or the one named by `SETTLEMENT_BEFORE`. */
const loadTree = async (src: string) => {
  const from = (path: string) => import(resolve(src, path))
  return {
    Chain: (await from("chain/Chain.ts")).Chain,
    Eip3009: await from("chain/Eip3009.ts"),
    databaseFromUrl: (await from("db/Database.ts")).databaseFromUrl,
    Authorizations: (await from("ledger/Authorizations.ts")).Authorizations,
    Ledger: (await from("ledger/Ledger.ts")).Ledger,
    Treasury: (await from("ledger/Treasury.ts")).Treasury,
    Settlement: (await from("payment/Settlement.ts")).Settlement
  }
}
type Tree = Awaited<ReturnType<typeof loadTree>>

interface Side {
  readonly name: string
  readonly database: string
  readonly context: Context.Context<Any>
  readonly runOnce: Effect.Effect<number>
  readonly tree: Tree
}

// biome-ignore lint/suspicious/noExplicitAny: the trees' services are typed by their own modules
type Any = any

const startSide = async (name: string, tree: Tree, adminUrl: string, scope: Scope.Scope): Promise<Side> => {
  const database = `settle_${name}`
  await Effect.runPromise(admin(adminUrl, `CREATE DATABASE ${database}`))
  const url = withDatabase(adminUrl, database)
  const chainConfig = ConfigProvider.layer(ConfigProvider.fromEnvRecord({ CHAIN_BLOCK_TIME: BLOCK_TIME }))
  const base = Layer.mergeAll(tree.databaseFromUrl(url), tree.Chain.layer.pipe(Layer.provide(chainConfig)))
  const services = Layer.mergeAll(
    tree.Authorizations.layer,
    tree.Ledger.layer,
    Layer.effect(tree.Treasury, tree.Treasury.make())
  ).pipe(Layer.provideMerge(base)) as unknown as Layer.Layer<Any>
  const context = await Effect.runPromise(Layer.buildWithScope(services, scope))
  const settlement = (await Effect.runPromise(
    (tree.Settlement.make as Effect.Effect<Any, never, never>).pipe(Effect.provide(context))
  )) as { runOnce: Effect.Effect<number> }
  return { name, database, context, runOnce: settlement.runOnce, tree }
}

const withDatabase = (url: string, name: string) => {
  const parsed = new URL(url)
  parsed.pathname = `/${name}`
  return parsed.toString()
}

/** Statements on the admin connection (another database: never counted in a side's figures). */
const admin = (url: string, text: string) =>
  Effect.gen(function* () {
    const { PgClient } = yield* Effect.promise(() => import("@effect/sql-pg"))
    const { Redacted } = yield* Effect.promise(() => import("effect"))
    return yield* Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      return yield* sql.unsafe<Record<string, unknown>>(text)
    }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })), Effect.orDie)
  })

/** `COUNT` captured authorizations of the demo wallets, each with its pending receipt, due now. */
const seed = (side: Side, round: number) =>
  Effect.gen(function* () {
    const chain: Any = yield* side.tree.Chain
    const sql = yield* SqlClient.SqlClient
    const nowS = Math.floor(Date.now() / 1000)
    for (let i = 0; i < COUNT; i++) {
      const account = privateKeyToAccount(chain.demoWallets[i % 4].privateKey)
      const authorization = {
        from: account.address,
        to: chain.treasury,
        value: 1_000n,
        validAfter: 0n,
        validBefore: BigInt(nowS + 3600),
        nonce: side.tree.Eip3009.randomAuthorizationNonce()
      }
      const signature = yield* Effect.promise(() =>
        side.tree.Eip3009.signTransferAuthorization(account, {
          token: chain.token,
          chainId: chain.chainId,
          domain: chain.tokenDomain,
          ...authorization
        })
      )
      const payer = account.address.toLowerCase()
      const id = `req_${side.name}_${round}_${i}`
      const body = pendingReceiptBody(id, payer, 1000)
      yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                       provider_id, authorized, charged, status)
                 VALUES (${id}, 'openai', 'x402', ${payer}, 'auto', 'chat-small', 'p', 1000, 1000, 'captured')`
      yield* sql`INSERT INTO receipts (request_id, epoch_id, body) VALUES (${id}, 1, ${JSON.stringify(body)}::jsonb)`
      yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                                  signature, status, attempts)
                 VALUES (${payer}, ${authorization.nonce}, ${id}, 1000, 0, ${authorization.validBefore.toString()},
                         ${signature}, 'pending', 0)`
    }
  }).pipe(Effect.provide(side.context), Effect.orDie)

const settledCount = (side: Side) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [row] = yield* sql<{ landed: number; signed: number }>`
      SELECT /* bench probe */ (SELECT count(*)::int FROM x402_authorizations WHERE status = 'landed') AS landed,
             (SELECT count(*)::int FROM receipts WHERE signature IS NOT NULL AND body->>'settlement' = 'landed') AS signed`
    return row!
  }).pipe(Effect.provide(side.context), Effect.orDie)

interface Counted {
  readonly statements: number
  readonly nested: number
  /** Commits (explicit transactions and statements run on their own alike). */
  readonly transactions: number
  readonly writes: number
  readonly passes: number
  readonly byQuery: ReadonlyArray<{ query: string; calls: number }>
}

const measureRound = async (side: Side, adminUrl: string, round: number): Promise<Counted> => {
  await Effect.runPromise(seed(side, round))
  const target = (round + 1) * COUNT
  const [{ oid }] = (await Effect.runPromise(
    admin(adminUrl, `SELECT oid::int AS oid FROM pg_database WHERE datname = '${side.database}'`)
  )) as [{ oid: number }]
  // Backends report their transaction counts when idle, within 10 s (PGSTAT_IDLE_INTERVAL): let them.
  const commits = async () => {
    await new Promise((done) => setTimeout(done, 11_000))
    const [row] = (await Effect.runPromise(
      admin(adminUrl, `SELECT xact_commit::int AS n FROM pg_stat_database WHERE datid = ${oid}`)
    )) as [{ n: number }]
    return row.n
  }
  const xid = async () =>
    Number(
      (
        (await Effect.runPromise(
          admin(adminUrl, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS x")
        )) as [{ x: string }]
      )[0].x
    )
  const commits0 = await commits()
  await Effect.runPromise(admin(adminUrl, `SELECT pg_stat_statements_reset(0, ${oid}, 0)`))
  const xid0 = await xid()
  let passes = 0
  while ((await Effect.runPromise(settledCount(side))).landed < target) {
    await Effect.runPromise(side.runOnce)
    passes++
    if (passes > 50) throw new Error(`${side.name}: not all landed after 50 passes`)
  }
  const deadline = Date.now() + 30_000
  while ((await Effect.runPromise(settledCount(side))).signed < target && Date.now() < deadline)
    await new Promise((done) => setTimeout(done, 100))
  const xid1 = await xid()
  const commits1 = await commits()
  const rows = (await Effect.runPromise(
    admin(
      adminUrl,
      `SELECT regexp_replace(left(query, 300), '\\s+', ' ', 'g') AS query, toplevel, calls::int AS calls
       FROM pg_stat_statements WHERE dbid = ${oid} ORDER BY calls DESC`
    )
  )) as Array<{ query: string; toplevel: boolean; calls: number }>
  const counted = rows.filter((r) => !background(r.query))
  // Each background statement and probe ran on its own (no BEGIN): one commit each, not settlement's.
  const elsewhere = rows.filter((r) => r.toplevel && background(r.query)).reduce((a, r) => a + r.calls, 0)
  const top = counted.filter((r) => r.toplevel)
  // Transaction control is counted through the commits (prepared, it reaches pg_stat_statements unevenly).
  const isUtility = (q: string) => /^(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)/i.test(q.trim())
  return {
    statements: top.filter((r) => !isUtility(r.query)).reduce((a, r) => a + r.calls, 0),
    nested: counted.filter((r) => !r.toplevel).reduce((a, r) => a + r.calls, 0),
    transactions: commits1 - commits0 - elsewhere,
    writes: xid1 - xid0,
    passes,
    byQuery: top.filter((r) => !isUtility(r.query))
  }
}

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-settlement-"))
  chmodSync(dataDir, 0o755)
  const scope = await Effect.runPromise(Scope.make())
  try {
    const pgDir = join(dataDir, "pg")
    await Effect.runPromise(Effect.scoped(startEmbeddedPostgres({ dataDir: pgDir, database: "bench" })))
    appendFileSync(
      join(pgDir, "postgres", "postgresql.conf"),
      [
        "shared_preload_libraries = 'pg_stat_statements'",
        "pg_stat_statements.track = all",
        "pg_stat_statements.track_utility = off",
        "pg_stat_statements.max = 5000",
        ""
      ].join("\n")
    )
    const adminUrl = await Effect.runPromise(
      Scope.provide(scope)(startEmbeddedPostgres({ dataDir: pgDir, database: "bench" }))
    )
    await Effect.runPromise(admin(adminUrl, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    const sides: Array<Side> = []
    if (process.env.SETTLEMENT_BEFORE !== undefined)
      sides.push(await startSide("before", await loadTree(process.env.SETTLEMENT_BEFORE), adminUrl, scope))
    sides.push(
      await startSide("this", await loadTree(resolve(import.meta.dirname, "../src")), adminUrl, scope)
    )
    const results = new Map<string, Array<Counted>>(sides.map((s) => [s.name, []]))
    for (let round = 0; round < ROUNDS; round++) {
      for (const side of sides) {
        const counted = await measureRound(side, adminUrl, round)
        results.get(side.name)!.push(counted)
        const per = (n: number) => (n / COUNT).toFixed(2)
        log(
          `round ${round + 1} ${side.name}: ${counted.passes} passes; per authorization ${per(counted.statements)} statements (+${per(counted.nested)} nested), ${per(counted.transactions)} commits, ${per(counted.writes)} writing commits`
        )
      }
    }
    const lines = [
      `settling ${COUNT} x402 authorizations a round, ${ROUNDS} rounds, ${BLOCK_TIME} s blocks; per authorization settled:`
    ]
    for (const side of sides) {
      const rounds = results.get(side.name)!
      const f = (pick: (c: Counted) => number) => rounds.map((c) => (pick(c) / COUNT).toFixed(2)).join(" / ")
      lines.push(
        `  ${side.name.padEnd(7)} statements ${f((c) => c.statements)}; nested ${f((c) => c.nested)}; commits ${f((c) => c.transactions)}; writing commits ${f((c) => c.writes)}`
      )
      const last = rounds.at(-1)!
      for (const q of last.byQuery.slice(0, 24))
        lines.push(`      ${(q.calls / COUNT).toFixed(3).padStart(7)}  ${q.query.slice(0, 140)}`)
    }
    process.stdout.write(`${lines.join("\n")}\n`)
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    if (process.env.BENCH_KEEP === undefined) rmSync(dataDir, { recursive: true, force: true })
  }
}

runMain(main)
