import { randomBytes } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Cause, Effect, Exit, Layer, Option } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { Ledger, type ReservationRecord } from "../../src/ledger/Ledger.ts"
import type { LeaseRequest } from "../../src/market/QuoteBook.ts"
import { hashSecret } from "../../src/payment/Keys.ts"
import { elapsedMs } from "../../src/process/ElapsedClock.ts"
import { tracingWith } from "../../src/Telemetry.ts"
import { TestDatabase } from "../support/Database.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { holdFolds } from "./support.ts"

/**
 * D545: the reservations on one key as sent that are ready in the same turn go to Postgres as one statement,
 * each answered as if reserved alone in its order; a batch the key cannot cover whole is written again one
 * record at a time. Statements are counted as the router's SQL spans; what each call wrote is read back.
 */
const exporter = new InMemorySpanExporter()
const LedgerLayer = Ledger.layer.pipe(
  Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)),
  // Merged: the statements run in the tests' own fibers (and fibers forked from them) are traced too.
  Layer.provideMerge(tracingWith([new SimpleSpanProcessor(exporter)]))
)

/** Key reservations sent since the last reset (each statement that updates a key's row for a reservation). */
const reservingStatements = () =>
  exporter
    .getFinishedSpans()
    .map((span) => String(span.attributes["db.query.text"] ?? ""))
    .filter((text) => /UPDATE api_keys SET reserved = reserved \+/.test(text)).length

const record = (authorized: number, lease?: LeaseRequest): Omit<ReservationRecord, "payer"> => ({
  requestId: `req_${randomBytes(8).toString("hex")}`,
  dialect: "openai",
  requestedModel: "auto",
  modelClass: "chat-small",
  providerId: "p-batch",
  authorized,
  agent: { "x-agent": "batch-test" },
  lease
})

const leaseOn = (providerId: string, capacity: number): LeaseRequest => ({
  leaseId: crypto.randomUUID(),
  providerId,
  modelClass: "chat-small",
  capacity,
  requestedAt: elapsedMs()
})

/** Each record reserved by its own call on the key as sent, all started in the same turn. */
const reserveAll = (secret: string, records: ReadonlyArray<Omit<ReservationRecord, "payer">>) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const now = Date.now()
    exporter.reset()
    return yield* Effect.forEach(
      records,
      (r) => Effect.exit(ledger.reserveCreditKey(r, hashSecret(secret), now)),
      { concurrency: "unbounded" }
    )
  })

/** The answer of a call that succeeded. */
const successOf = <A>(exit: Exit.Exit<A, unknown>): A => {
  assert.isTrue(Exit.isSuccess(exit), String(exit))
  return (exit as Exit.Success<A, unknown>).value
}

/** The typed failure of a call that failed. */
const failureOf = (exit: Exit.Exit<unknown, unknown>) => {
  assert.isTrue(Exit.isFailure(exit))
  return Option.getOrThrow(Cause.findErrorOption((exit as Exit.Failure<unknown, unknown>).cause)) as {
    readonly _tag: string
    readonly code?: string
    readonly reason?: string
  }
}

/** What a request's reservation wrote: its row, its ledger rows and its lease. */
const written = (requestId: string, leaseId: string | undefined) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const requests = yield* sql<{ status: string; payer: string; authorized: string; key_id: string }>`
      SELECT status, payer, authorized::text, key_id FROM requests WHERE request_id = ${requestId}`
    const entries = yield* sql<{ entry: string }>`
      SELECT kind || ' ' || account || ' ' || amount AS entry FROM ledger_entries WHERE request_id = ${requestId}`
    const leases = yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM capacity_leases WHERE lease_id = ${leaseId ?? ""}`
    return {
      request: requests.map((r) => `${r.status} ${r.payer} ${r.authorized} ${r.key_id}`),
      entries: entries.map((e) => e.entry),
      leases: leases[0]!.n
    }
  }).pipe(Effect.orDie)

describe("a key's reservations ready in the same turn share one statement (D545)", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "six calls: one statement; each answered as if reserved alone in order, with its own rows",
      () =>
        Effect.gen(function* () {
          yield* holdFolds
          const budget = 1_000_000
          const key = yield* fundedKey({ budget, balance: 5_000_000 })
          const records = [1_000, 2_500, 700, 4_000, 1, 9_999].map((a) =>
            record(a, leaseOn("p-batch-a", 100))
          )
          const exits = yield* reserveAll(key.secret, records)
          assert.strictEqual(reservingStatements(), 1)
          const answers = exits.map(successOf)
          // The calls in the order they joined the batch, each answered as if reserved alone after the ones
          // before it.
          let left = budget
          for (const [i, answer] of answers.entries()) {
            left -= records[i]!.authorized
            assert.strictEqual(answer.keyRemaining, left, `call ${i}`)
            assert.strictEqual(answer.wallet, key.wallet)
            assert.isTrue(answer.leaseGranted)
          }
          const total = records.reduce((sum, r) => sum + r.authorized, 0)
          const state = yield* keyState(key.keyId)
          assert.deepStrictEqual(
            { reserved: state.reserved, available: state.available, walletReserved: state.walletReserved },
            { reserved: total, available: 5_000_000 - total, walletReserved: total }
          )
          const sql = yield* SqlClient.SqlClient
          const [{ requests }] = yield* sql<{ requests: number }>`
          SELECT requests::int FROM api_keys WHERE key_id = ${key.keyId}`
          assert.strictEqual(requests, records.length)
          for (const r of records) {
            assert.deepStrictEqual(yield* written(r.requestId, r.lease?.leaseId), {
              request: [`reserved ${key.wallet} ${r.authorized} ${key.keyId}`],
              entries: [`credit_reserved ${key.wallet} ${r.authorized}`],
              leases: 1
            })
          }
          const [{ agents }] = yield* sql<{ agents: number }>`
          SELECT count(*)::int AS agents FROM requests
          WHERE request_id IN ${sql.in(records.map((r) => r.requestId))} AND agent->>'x-agent' = 'batch-test'`
          assert.strictEqual(agents, records.length)

          // A lone call: a statement of its own, as before.
          const [lone] = yield* reserveAll(key.secret, [record(10)])
          assert.isTrue(Exit.isSuccess(lone!))
          assert.strictEqual(reservingStatements(), 1)
        })
    )

    it.effect(
      "a batch the key's cap or the owner's balance cannot cover whole: refused exactly as alone",
      () =>
        Effect.gen(function* () {
          yield* holdFolds
          const sql = yield* SqlClient.SqlClient
          for (const [limit, code] of [
            [{ budget: 3_500, balance: 1_000_000 }, "key_budget_exhausted"],
            [{ budget: 1_000_000, balance: 2_500 }, "key_unfunded"]
          ] as const) {
            const key = yield* fundedKey(limit)
            const records = Array.from({ length: 5 }, () => record(1_000))
            const exits = yield* reserveAll(key.secret, records)
            // The batch, refused whole, then each call alone.
            assert.strictEqual(reservingStatements(), 1 + records.length)
            const fits = Math.floor(Math.min(limit.budget, limit.balance) / 1_000)
            assert.strictEqual(exits.filter(Exit.isSuccess).length, fits, code)
            for (const exit of exits) {
              if (Exit.isFailure(exit)) assert.deepInclude(failureOf(exit), { _tag: "CreditRefused", code })
            }
            const state = yield* keyState(key.keyId)
            assert.strictEqual(state.reserved, fits * 1_000)
            assert.strictEqual(state.walletReserved, fits * 1_000)
            const [{ n }] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM requests WHERE key_id = ${key.keyId}`
            assert.strictEqual(n, fits)
            const [{ entries }] = yield* sql<{ entries: number }>`
            SELECT count(*)::int AS entries FROM ledger_entries WHERE request_id IN ${sql.in(records.map((r) => r.requestId))}`
            assert.strictEqual(entries, fits)
          }
        })
    )

    it.effect(
      "a key that fails a gate fails every call of its batch, in one statement, writing nothing",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const revoked = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          yield* sql`UPDATE api_keys SET revoked_at = now() WHERE key_id = ${revoked.keyId}`
          const expired = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          yield* sql`UPDATE api_keys SET expires_at = now() - interval '1 minute' WHERE key_id = ${expired.keyId}`
          for (const [key, reason] of [
            [revoked, "unknown"],
            [expired, "expired"]
          ] as const) {
            const records = Array.from({ length: 4 }, () => record(1_000, leaseOn("p-batch-gate", 10)))
            const exits = yield* reserveAll(key.secret, records)
            assert.strictEqual(reservingStatements(), 1, reason)
            for (const exit of exits) assert.deepInclude(failureOf(exit), { _tag: "KeyRefused", reason })
            const [{ n }] = yield* sql<{ n: number }>`
            SELECT (SELECT count(*) FROM requests WHERE request_id IN ${sql.in(records.map((r) => r.requestId))})::int
                 + (SELECT count(*) FROM capacity_leases WHERE provider_id = 'p-batch-gate')::int AS n`
            assert.strictEqual(n, 0)
            const state = yield* keyState(key.keyId)
            assert.strictEqual(state.reserved, 0)
          }
        })
    )

    it.effect(
      "a key expiring between two calls' clock readings in one turn: the earlier call is reserved, the later refused",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const ledger = yield* Ledger
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          // Expiry is read to the second: the key expires at a whole second a minute from now.
          const expiresMs = Math.ceil(Date.now() / 1_000) * 1_000 + 60_000
          yield* sql`UPDATE api_keys SET expires_at = to_timestamp(${expiresMs / 1_000}) WHERE key_id = ${key.keyId}`
          const [before, after] = [record(1_000), record(1_000)]
          exporter.reset()
          const [early, late] = yield* Effect.all(
            [
              Effect.exit(ledger.reserveCreditKey(before, hashSecret(key.secret), expiresMs - 1_000)),
              Effect.exit(ledger.reserveCreditKey(after, hashSecret(key.secret), expiresMs + 1_000))
            ],
            { concurrency: "unbounded" }
          )
          // The batch, checked at the later reading, then the earlier call alone at its own.
          assert.strictEqual(reservingStatements(), 2)
          assert.strictEqual(successOf(early!).keyId, key.keyId)
          assert.deepInclude(failureOf(late!), { _tag: "KeyRefused", reason: "expired" })
          assert.strictEqual((yield* keyState(key.keyId)).reserved, 1_000)
        })
    )

    it.effect("leases at a quote's ceiling: the batch takes what is free and says which calls got one", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const records = [
          ...Array.from({ length: 4 }, () => record(100, leaseOn("p-batch-ceiling", 2))),
          ...Array.from({ length: 2 }, () => record(100, leaseOn("p-batch-other", 5))),
          record(100)
        ]
        const exits = yield* reserveAll(key.secret, records)
        assert.strictEqual(reservingStatements(), 1)
        const granted = exits.map((exit) => successOf(exit).leaseGranted)
        // Taken in the calls' order: the first two at the ceiling got the two slots.
        assert.deepStrictEqual(granted.slice(0, 4), [true, true, false, false])
        assert.deepStrictEqual(granted.slice(4), [true, true, undefined])
        const held = yield* sql<{ lease_id: string }>`
          SELECT lease_id FROM capacity_leases WHERE provider_id IN ('p-batch-ceiling', 'p-batch-other')`
        const grantedIds = records.filter((_, i) => granted[i] === true).map((r) => r.lease!.leaseId)
        assert.deepStrictEqual(held.map((row) => row.lease_id).sort(), grantedIds.sort())
        // Every call is reserved, leased or not (one refused a lease is released by its caller, D311).
        const [{ n }] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM requests WHERE key_id = ${key.keyId} AND status = 'reserved'`
        assert.strictEqual(n, records.length)
      })
    )
  })
})
