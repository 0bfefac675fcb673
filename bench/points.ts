/**
 * `npm run bench:points`: what points cost with many receipts. Writes BENCH_RECEIPTS receipts (default
 * 50,000) through the ledger's own functions (x402 reservations and captures; one in five lands), then
 * times the reads the public endpoints make (leaderboard, a wallet's account with its rank, a provider)
 * against the baseline of computing the same leaderboard from the receipts on every read, and the
 * capture with the points trigger against the capture without it, in the same run. Prints figures;
 * asserts nothing but that the read model equals the receipts' aggregate at the end.
 *
 * With DATABASE_URL it creates (and drops) a database of its own beside it; else an embedded Postgres.
 */

import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../src/chain/Chain.ts"
import { DatabaseLive, databaseFromUrl } from "../src/db/Database.ts"
import type { ReceiptBody } from "../src/domain/Receipt.ts"
import { Ledger } from "../src/ledger/Ledger.ts"
import { Providers } from "../src/market/Providers.ts"
import { Points } from "../src/points/Points.ts"
import { RouterConfig } from "../src/RouterConfig.ts"

const RECEIPTS = Number(process.env.BENCH_RECEIPTS ?? 50_000)
const WALLETS = Number(process.env.BENCH_WALLETS ?? 5_000)
const PROVIDERS = 10
const CAPTURE_SAMPLE = 1_000

const quantile = (xs: ReadonlyArray<number>, q: number) => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
}
const summary = (xs: ReadonlyArray<number>) =>
  `p50 ${quantile(xs, 0.5).toFixed(2)} ms  p95 ${quantile(xs, 0.95).toFixed(2)} ms  (n=${xs.length})`

const timed = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const started = performance.now()
    yield* effect
    return performance.now() - started
  })

const wallet = (i: number) => `0x${(i + 1).toString(16).padStart(40, "0")}`
const provider = (i: number) => `bench-provider-${i % PROVIDERS}`

/** One paid request as the ledger records it: reserve the authorization, capture, and (1 in 5) land. */
const writeReceipt = (i: number) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const requestId = `req_${randomBytes(12).toString("hex")}`
    const charged = 1_000 + ((i * 7_919) % 400_000)
    const payer = wallet(i % WALLETS)
    yield* ledger.reserveX402(
      {
        requestId,
        dialect: "chat",
        payer,
        requestedModel: "chat-small",
        modelClass: "chat-small",
        providerId: provider(i),
        authorized: charged,
        agent: {}
      },
      {
        nonce: `0x${randomBytes(32).toString("hex")}`,
        validAfter: 0n,
        validBefore: 9_999_999_999n,
        signature: `0x${"11".repeat(65)}`
      }
    )
    const receipt: ReceiptBody = {
      request_id: requestId,
      wallet: payer,
      provider_id: provider(i),
      model_class: "chat-small",
      in_tokens: 10,
      out_tokens: charged,
      cached_tokens: 0,
      price_in: 0,
      price_out: 1_000_000,
      price_in_cached: null,
      charged,
      authorized: charged,
      payment_ref: "",
      refund_ref: null,
      ttft_ms: 100,
      status: i % 17 === 0 ? "partial" : "ok",
      settlement: "pending",
      epoch_id: 1,
      session_id: null,
      quotes_competing: 3,
      created_at: Date.now()
    }
    // Economics are not what this bench measures: the smallest record the ledger accepts.
    const economics = { request_id: requestId, reaped: true } as const
    const capture = yield* timed(ledger.capture({ receipt, economics }))
    if (i % 5 === 0) {
      yield* ledger.finalizeReceipt(requestId, {
        payment_ref: `0x${randomBytes(32).toString("hex")}`,
        settlement: "landed"
      })
    }
    return { requestId, capture }
  })

const admin = (url: string, statement: string) =>
  Effect.gen(function* () {
    const sql = yield* PgClient.PgClient
    yield* sql.unsafe(statement)
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })), Effect.orDie)

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-points-"))
  const adminUrl = process.env.DATABASE_URL
  const name = `bench_points_${Date.now().toString(36)}`
  const database =
    adminUrl === undefined
      ? DatabaseLive
      : (() => {
          const url = new URL(adminUrl)
          url.pathname = `/${name}`
          return databaseFromUrl(url.toString())
        })()
  if (adminUrl !== undefined) await Effect.runPromise(admin(adminUrl, `CREATE DATABASE ${name}`))
  const runtime = ManagedRuntime.make(
    Layer.mergeAll(Ledger.layer, Points.layer).pipe(
      Layer.provideMerge(Providers.layer),
      Layer.provideMerge(Layer.mergeAll(database, Chain.layer)),
      Layer.provideMerge(RouterConfig.layerTest({ dataDir }))
    )
  )
  try {
    const lines = await runtime.runPromise(
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const points = yield* Points
        const providers = yield* Providers
        for (let p = 0; p < PROVIDERS; p++) {
          yield* providers.register({
            provider_id: provider(p),
            signer: wallet(10_000 + p),
            base_url: "http://127.0.0.1:9",
            dialect: "openai"
          })
        }
        const started = performance.now()
        const written = yield* Effect.forEach(
          Array.from({ length: RECEIPTS }, (_, i) => i),
          writeReceipt,
          { concurrency: 8 }
        )
        const writeSeconds = (performance.now() - started) / 1000

        // The capture with and without the trigger, alternating batches of 50 against the same book.
        const withTrigger: Array<number> = []
        const withoutTrigger: Array<number> = []
        for (let batch = 0; batch < CAPTURE_SAMPLE / 50; batch++) {
          for (let i = 0; i < 50; i++) {
            withTrigger.push((yield* writeReceipt(RECEIPTS + batch * 100 + i)).capture)
          }
          yield* sql`ALTER TABLE receipts DISABLE TRIGGER receipts_points`
          const untracked: Array<string> = []
          for (let i = 50; i < 100; i++) {
            const { requestId, capture } = yield* writeReceipt(RECEIPTS + batch * 100 + i)
            withoutTrigger.push(capture)
            untracked.push(requestId)
          }
          yield* sql`ALTER TABLE receipts ENABLE TRIGGER receipts_points`
          // Their points by the trigger's own function, so the book stays whole.
          yield* sql`
            SELECT points_apply_receipt(lower(body->>'wallet'), body->>'provider_id', request_id,
              CASE WHEN body->>'settlement' = 'landed' THEN (body->>'charged')::bigint ELSE 0 END,
              CASE WHEN body->>'settlement' = 'pending' THEN (body->>'charged')::bigint ELSE 0 END,
              1, CASE WHEN body->>'status' = 'ok' THEN 1 ELSE 0 END)
            FROM receipts WHERE request_id IN ${sql.in(untracked)}
          `
        }

        yield* sql`ANALYZE`
        const board: Array<number> = []
        const accounts: Array<number> = []
        const providerReads: Array<number> = []
        const scans: Array<number> = []
        for (let i = 0; i < 200; i++) {
          board.push(yield* timed(points.leaderboard(25)))
          accounts.push(yield* timed(points.account(wallet((i * 37) % WALLETS))))
          providerReads.push(yield* timed(points.provider(provider(i))))
        }
        const aggregate = sql<{ wallet: string; settled: string; pending: string }>`
          SELECT lower(body->>'wallet') AS wallet,
                 sum(CASE WHEN body->>'settlement' = 'landed' THEN (body->>'charged')::bigint ELSE 0 END)::text
                   AS settled,
                 sum(CASE WHEN body->>'settlement' = 'pending' THEN (body->>'charged')::bigint ELSE 0 END)::text
                   AS pending
          FROM receipts GROUP BY 1 ORDER BY sum(CASE WHEN body->>'settlement' = 'landed'
            THEN (body->>'charged')::bigint ELSE 0 END) DESC
        `
        for (let i = 0; i < 20; i++)
          scans.push(yield* timed(aggregate.pipe(Effect.map((rows) => rows.slice(0, 25)))))

        // The read model equals the receipts' own aggregate, wallet by wallet.
        const fromReceipts = yield* aggregate
        const materialized = yield* sql<{ wallet: string; settled: string; pending: string }>`
          SELECT wallet, settled_charged::text AS settled, pending_charged::text AS pending FROM points_wallets
        `
        const byWallet = new Map(materialized.map((row) => [row.wallet, row]))
        const drift = fromReceipts.filter((row) => {
          const m = byWallet.get(row.wallet)
          return m === undefined || m.settled !== row.settled || m.pending !== row.pending
        })
        if (drift.length > 0)
          return yield* Effect.die(new Error(`points drifted for ${drift.length} wallets`))

        const [{ n }] = (yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM receipts`) as [
          { n: number }
        ]
        const mean = written.reduce((a, w) => a + w.capture, 0) / written.length
        return [
          `points with ${n} receipts over ${WALLETS} wallets and ${PROVIDERS} providers (read model = receipts' aggregate)`,
          `  written in ${writeSeconds.toFixed(1)} s through Ledger.reserveX402 + capture (+ finalize 1 in 5)`,
          `  capture, mean of the bulk write      ${mean.toFixed(2)} ms (8 concurrent)`,
          `  capture with the points trigger      ${summary(withTrigger)}`,
          `  capture without it (baseline)        ${summary(withoutTrigger)}`,
          `  leaderboard (top 25, index)          ${summary(board)}`,
          `  account (row + rank count)           ${summary(accounts)}`,
          `  provider (8 shard rows)              ${summary(providerReads)}`,
          `  leaderboard computed from receipts   ${summary(scans)}  (the compute-on-read baseline)`
        ]
      })
    )
    process.stdout.write(`${lines.join("\n")}\n`)
  } finally {
    await runtime.dispose()
    if (adminUrl !== undefined)
      await Effect.runPromise(admin(adminUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
    rmSync(dataDir, { recursive: true, force: true })
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${error}\n`)
    process.exit(1)
  }
)
