/**
 * `npm run bench:marketdata` (also run by `npm run bench`): the public market data reads with
 * `BENCH_CLEARS` (100,000) clearing records in the database, and the live events fan-out to
 * `BENCH_SUBSCRIBERS` (1,000) connected subscribers. Prints figures beside same-run baselines
 * (`/health` for a read, the same stats computed by SQL on read, one subscriber for the fan-out);
 * asserts nothing. Targets (issue 13): each read p50 under 5 ms; a clear to the last subscriber's frame
 * under 100 ms.
 *
 * The clears are written the way the paid path writes them (a request, its receipt and its economics;
 * the settling statement's trigger derives the clearing record, D547). With DATABASE_URL it creates (and
 * drops) a database of its own beside it; else an embedded Postgres. The subscribers run in a child
 * process (`bench/marketdataClients.ts`), so the router's process does only the router's work.
 */

import { type ChildProcess, fork } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { PgClient } from "@effect/sql-pg"
import { ConfigProvider, Effect, Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../src/chain/Chain.ts"
import { DatabaseLive, databaseFromUrl } from "../src/db/Database.ts"
import { freePort } from "../src/devnet/EmbeddedPostgres.ts"
import { HttpServerLive } from "../src/http/Server.ts"
import { MarketData } from "../src/marketdata/MarketData.ts"
import { ServicesLive } from "../src/Router.ts"
import { RouterConfig } from "../src/RouterConfig.ts"

const CLEARS = Number(process.env.BENCH_CLEARS ?? 100_000)
const SUBSCRIBERS = Number(process.env.BENCH_SUBSCRIBERS ?? 1_000)
const READS = Number(process.env.BENCH_READS ?? 300)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 20)

const quantile = (xs: ReadonlyArray<number>, q: number) => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
}
const summary = (xs: ReadonlyArray<number>) =>
  xs.length === 0
    ? "no samples"
    : `p50 ${quantile(xs, 0.5).toFixed(2)} ms  p95 ${quantile(xs, 0.95).toFixed(2)} ms  (n=${xs.length})`
const now = () => performance.timeOrigin + performance.now()
const mb = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MB`

const admin = (url: string, statement: string) =>
  Effect.gen(function* () {
    const sql = yield* PgClient.PgClient
    yield* sql.unsafe(statement)
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })), Effect.orDie)

/**
 * `count` paid requests from `first` on, spread over the last 24 h (or at `at`), written as the paid path
 * writes them: the request row, the receipt and the economics, in one transaction.
 */
const writeClears = (first: number, count: number, at?: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const span = 86_000_000
    const t0 = Date.now()
    yield* sql.withTransaction(
      Effect.gen(function* () {
        yield* sql.unsafe(
          `CREATE TEMP TABLE IF NOT EXISTS bench_gen ON COMMIT DROP AS
           SELECT g, 'bench_' || g AS id,
                  (ARRAY['chat-small','chat-medium','chat-large','reasoning-large','grounded-medium'])[1 + g % 5] AS cls,
                  'bench-prov-' || (g % 7) AS prov,
                  '0x' || lpad(to_hex(g % 997), 40, '0') AS wallet,
                  200 + (g * 7919) % 4000 AS tin, 50 + (g * 104729) % 1500 AS tout,
                  (100000 * (1 + g % 5)) * (90 + g % 21) / 100 AS pin,
                  (400000 * (1 + g % 5)) * (90 + (g * 3) % 21) / 100 AS pout,
                  40 + (g * 31) % 400 AS ttft,
                  ${at === undefined ? `${t0} - ${span} + (g * 86000000::bigint / ${Math.max(count, 1)}) % ${span}` : `${at}::bigint`} AS at
           FROM generate_series(${first}::bigint, ${first + count - 1}::bigint) g`
        )
        yield* sql.unsafe(`
          INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class, provider_id,
                                authorized, charged, status, created_at, finished_at)
          SELECT id, 'chat', 'credit', wallet, cls, cls, prov, 100000000,
                 ceil((tin * pin + tout * pout) / 1000000.0)::bigint, 'captured',
                 to_timestamp(at / 1000.0), to_timestamp(at / 1000.0)
          FROM bench_gen`)
        // The economics before the receipts: the receipts' statement trigger clears what has both (D547).
        yield* sql.unsafe(`
          INSERT INTO economics (request_id, body)
          SELECT id, jsonb_build_object('request_id', id, 'profile', 'balanced', 'price_setter', 'runner-up',
                                        'quotes_competing', 3, 'clear', jsonb_build_object('price_in', pin, 'price_out', pout))
          FROM bench_gen`)
        yield* sql.unsafe(`
          INSERT INTO receipts (request_id, epoch_id, body, final)
          SELECT id, 1, jsonb_build_object(
            'request_id', id, 'wallet', wallet, 'provider_id', prov, 'model_class', cls,
            'in_tokens', tin, 'out_tokens', tout, 'cached_tokens', 0, 'price_in', pin, 'price_out', pout,
            'price_in_cached', null, 'charged', ceil((tin * pin + tout * pout) / 1000000.0)::bigint,
            'authorized', 100000000, 'payment_ref', 'credit:bench', 'refund_ref', null, 'ttft_ms', ttft,
            'status', 'ok', 'settlement', 'landed', 'epoch_id', 1, 'session_id', null, 'quotes_competing', 3,
            'created_at', at), true
          FROM bench_gen`)
      })
    )
  }).pipe(Effect.orDie)

interface Child {
  readonly process: ChildProcess
  readonly next: (type: string) => Promise<Record<string, unknown>>
}

const startClients = (url: string, count: number): Promise<Child> =>
  new Promise((resolve, reject) => {
    const child = fork(join(import.meta.dirname, "marketdataClients.ts"), [url, String(count)], {
      execArgv: ["--import", "tsx"]
    })
    const waiters = new Map<string, (m: Record<string, unknown>) => void>()
    let dropped = 0
    child.on("message", (m: Record<string, unknown>) => {
      if (m.type === "dropped") dropped += 1
      if (m.type === "error") reject(new Error(String(m.message)))
      const waiter = waiters.get(String(m.type))
      if (waiter !== undefined) {
        waiters.delete(String(m.type))
        waiter(m)
      }
    })
    const next = (type: string) => new Promise<Record<string, unknown>>((ok) => waiters.set(type, ok))
    next("ready").then(() =>
      resolve({ process: child, next: (t) => next(t).then((m) => ({ ...m, dropped })) })
    )
  })

/** Rounds of: a clear committed, then the time until the first and the last subscriber had its frame. */
const fanout = async (
  runtime: ManagedRuntime.ManagedRuntime<SqlClient.SqlClient, never>,
  url: string,
  count: number,
  firstId: number
) => {
  const clients = await startClients(url, count)
  const rss = process.memoryUsage().rss
  const lastMs: Array<number> = []
  const firstMs: Array<number> = []
  let missed = 0
  let dropped = 0
  for (let round = 0; round < ROUNDS; round++) {
    const id = firstId + round
    const watching = clients.next("watching")
    clients.process.send({ type: "watch", id: `"bench_${id}"` })
    await watching
    const seen = clients.next("seen")
    await runtime.runPromise(writeClears(id, 1, Date.now()))
    const committed = now()
    const result = await seen
    if (Number(result.seen) < count) missed += 1
    else {
      firstMs.push(Number(result.first) - committed)
      lastMs.push(Number(result.last) - committed)
    }
    dropped = Number(result.dropped)
    await new Promise((r) => setTimeout(r, 150))
  }
  const bytes = clients.next("bytes")
  clients.process.send({ type: "bytes" })
  const received = Number((await bytes).bytes)
  clients.process.kill()
  return { lastMs, firstMs, rss, missed, dropped, received }
}

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-marketdata-"))
  const adminUrl = process.env.DATABASE_URL
  const name = `bench_marketdata_${Date.now().toString(36)}`
  const database =
    adminUrl === undefined
      ? DatabaseLive
      : (() => {
          const url = new URL(adminUrl)
          url.pathname = `/${name}`
          return databaseFromUrl(url.toString())
        })()
  if (adminUrl !== undefined) await Effect.runPromise(admin(adminUrl, `CREATE DATABASE ${name}`))
  const port = await Effect.runPromise(freePort)
  const url = `http://127.0.0.1:${port}`
  const config = RouterConfig.layerTest({ port, publicUrl: url, dataDir })
  const settings = ConfigProvider.layerAdd(
    ConfigProvider.fromUnknown({ MARKET_EVENTS_CAPACITY: String(SUBSCRIBERS + 10) }),
    { asPrimary: true }
  )
  const seeded = ManagedRuntime.make(database.pipe(Layer.provideMerge(config)))
  let runtime: ManagedRuntime.ManagedRuntime<SqlClient.SqlClient | MarketData, unknown> | undefined
  try {
    const seedStart = performance.now()
    for (let first = 1; first <= CLEARS; first += 20_000) {
      await seeded.runPromise(writeClears(first, Math.min(20_000, CLEARS - first + 1)))
    }
    const seedMs = performance.now() - seedStart
    await seeded.dispose()

    const startAt = performance.now()
    runtime = ManagedRuntime.make(
      HttpServerLive.pipe(
        Layer.provideMerge(ServicesLive),
        Layer.provideMerge(Layer.mergeAll(database, Chain.layer).pipe(Layer.provideMerge(config))),
        Layer.provide(settings)
      )
    )
    const market = await runtime.runPromise(Effect.service(MarketData))
    const startMs = performance.now() - startAt
    const held = await runtime.runPromise(
      Effect.map(market.window, (w) => w.stats(w.classes()).reduce((n, c) => n + c.count, 0))
    )

    const time = async (path: string) => {
      const xs: Array<number> = []
      for (let i = 0; i < READS; i++) {
        const t = performance.now()
        const response = await fetch(`${url}${path}`)
        await response.arrayBuffer()
        if (response.status !== 200) throw new Error(`${path}: ${response.status}`)
        xs.push(performance.now() - t)
      }
      return xs
    }
    const sqlStats = async () => {
      const xs: Array<number> = []
      for (let i = 0; i < Math.min(READS, 30); i++) {
        const t = performance.now()
        await runtime!.runPromise(
          Effect.flatMap(Effect.service(SqlClient.SqlClient), (sql) =>
            sql.unsafe(
              `
              SELECT model_class, count(*), sum(tokens_in + tokens_out), sum(charged), sum(charge_num),
                     max(round(charge_num::numeric / nullif(tokens_in + tokens_out, 0))),
                     min(round(charge_num::numeric / nullif(tokens_in + tokens_out, 0))),
                     percentile_disc(0.5) WITHIN GROUP (ORDER BY ttft_ms),
                     percentile_disc(0.9) WITHIN GROUP (ORDER BY ttft_ms)
              FROM market_clears WHERE at_ms >= $1 GROUP BY model_class`,
              [Date.now() - 86_400_000]
            )
          ).pipe(Effect.orDie)
        )
        xs.push(performance.now() - t)
      }
      return xs
    }
    await time("/v1/market/snapshot")
    const reads = [
      ["GET /health (baseline: the cheapest read)", await time("/health")],
      ["GET /v1/market/snapshot", await time("/v1/market/snapshot")],
      [
        "GET /v1/market/candles (1 h, 1 min buckets)",
        await time("/v1/market/candles?model_class=chat-small")
      ],
      [
        "GET /v1/market/candles (24 h, 1,440 buckets)",
        await time("/v1/market/candles?model_class=chat-small&window_ms=86400000&bucket_ms=60000")
      ],
      [
        "GET /v1/market/index (24 h, hourly)",
        await time("/v1/market/index?window_ms=86400000&bucket_ms=3600000")
      ],
      ["GET /v1/market/stats", await time("/v1/market/stats")],
      ["stats computed by SQL on read (baseline)", await sqlStats()]
    ] as const
    const snapshotBytes = (await (await fetch(`${url}/v1/market/snapshot`)).arrayBuffer()).byteLength

    const rssIdle = process.memoryUsage().rss
    const one = await fanout(runtime as never, url, 1, 10_000_000)
    const many = await fanout(runtime as never, url, SUBSCRIBERS, 20_000_000)

    const lines = [
      `market data, ${held.toLocaleString()} clears in the 24 h window (seeded ${CLEARS.toLocaleString()} in ${(seedMs / 1000).toFixed(1)} s; router start with them ${(startMs / 1000).toFixed(1)} s)`,
      ...reads.map(([label, xs]) => `  ${label.padEnd(46)} ${summary(xs)}`),
      `  snapshot size ${(snapshotBytes / 1024).toFixed(1)} KB`,
      `live events: a clear committed → its frame at the subscribers (${ROUNDS} clears each)`,
      `  1 subscriber (baseline)   first/last ${summary(one.lastMs)}`,
      `  ${SUBSCRIBERS} subscribers        first ${summary(many.firstMs)}`,
      `  ${SUBSCRIBERS} subscribers        last  ${summary(many.lastMs)}`,
      `  rounds missed by any subscriber: ${many.missed}; subscribers dropped as slow: ${many.dropped}; bytes received ${mb(many.received)}`,
      `  router RSS: ${mb(rssIdle)} idle, ${mb(many.rss)} with ${SUBSCRIBERS} subscribers connected`
    ]
    process.stdout.write(`${lines.join("\n")}\n`)
  } finally {
    await runtime?.dispose()
    if (adminUrl !== undefined)
      await Effect.runPromise(admin(adminUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
    rmSync(dataDir, { recursive: true, force: true })
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(
      `${error}\n${error?.stack ?? ""}\n${JSON.stringify(error?.cause ?? error, null, 1)?.slice(0, 2000)}\n`
    )
    process.exit(1)
  }
)
