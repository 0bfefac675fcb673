import { assert, describe, layer } from "@effect/vitest"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Wallets } from "../../src/ledger/Wallets.ts"
import { tracingWith } from "../../src/Telemetry.ts"
import { lockWaited, TestDatabase } from "../support/Database.ts"
import { fundedKey, keyRows, keyState } from "../support/Keys.ts"
import { holdFolds, seededEconomics } from "./support.ts"

/**
 * Issue 12 item 3, D315: a credit capture does not touch its key's row or its owner's balance row; the
 * fold applies many captures to each in one statement. Counted by a trigger on both tables.
 */
const Database = Layer.mergeAll(TestDatabase, Chain.layer)
const LedgerLayer = Wallets.layer.pipe(Layer.provideMerge(Ledger.layer), Layer.provideMerge(Database))

const AUTHORIZED = 10_000
const CHARGED = 7_000

const receiptOf = (requestId: string, wallet: string): ReceiptBody => ({
  request_id: requestId,
  wallet,
  provider_id: "p1",
  model_class: "chat-small",
  in_tokens: 100,
  out_tokens: 20,
  cached_tokens: 0,
  price_in: 100_000,
  price_out: 400_000,
  price_in_cached: null,
  charged: CHARGED,
  authorized: AUTHORIZED,
  payment_ref: "",
  refund_ref: null,
  ttft_ms: 10,
  status: "ok",
  settlement: "landed",
  epoch_id: 1,
  session_id: null,
  quotes_competing: 1,
  created_at: Date.now()
})

const record = (requestId: string) => ({
  requestId,
  dialect: "openai",
  payer: "",
  requestedModel: "auto",
  modelClass: "chat-small",
  providerId: "p1",
  authorized: AUTHORIZED,
  agent: {}
})

type FundedKey = { readonly keyId: string; readonly wallet: string }
const SESSION_BUDGET = 50_000

/** A session funded by `key`, its opening call `requestId` in flight and its budget reserved on the key. */
const openKeySession = (key: FundedKey, sessionId: string, requestId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const ledger = yield* Ledger
    yield* sql`
      INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, key_id, budget,
                            provider_id, model_class, price_in, price_out, expires_at, status, in_flight)
      VALUES (${sessionId}, 'x', ${key.wallet}, 'credit', ${requestId}, ${key.keyId}, ${SESSION_BUDGET}, 'p1',
              'chat-small', 1, 1, now() + interval '1 hour', 'open', ${requestId})`
    yield* ledger.reserveCredit({ ...record(requestId), authorized: SESSION_BUDGET, sessionId }, key.keyId)
  }).pipe(Effect.orDie)

/** The settlement of a key-funded session's opening call that charged `charged`. */
const sessionOpening = (key: FundedKey, sessionId: string, requestId: string, charged: number) => ({
  receipt: {
    ...receiptOf(requestId, key.wallet),
    authorized: SESSION_BUDGET,
    charged,
    session_id: sessionId
  },
  economics: seededEconomics(requestId),
  source: {
    _tag: "SessionOpening" as const,
    sessionId,
    funding: { _tag: "Credit" as const, keyId: key.keyId },
    prefixTokens: 0
  }
})

/** Reserves and captures one request on the key through `ledger`. */
const paidRequest = (ledger: Ledger["Service"], key: FundedKey, requestId: string) =>
  Effect.gen(function* () {
    yield* ledger.reserveCredit(record(requestId), key.keyId)
    yield* ledger.capture({
      receipt: receiptOf(requestId, key.wallet),
      economics: seededEconomics(requestId),
      source: { _tag: "Credit", keyId: key.keyId }
    })
  }).pipe(Effect.orDie)

/** Every update of a key or balance row, counted by row (a trigger on both tables). */
const countUpdates = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE row_updates (tbl TEXT NOT NULL, id TEXT NOT NULL)`
  yield* sql.unsafe(`
    CREATE FUNCTION count_update() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO row_updates VALUES (TG_TABLE_NAME, coalesce(to_jsonb(NEW)->>'key_id', to_jsonb(NEW)->>'wallet'));
      RETURN NEW;
    END $$`)
  for (const table of ["api_keys", "wallet_balances"]) {
    yield* sql.unsafe(
      `CREATE TRIGGER count_update AFTER UPDATE ON ${table} FOR EACH ROW EXECUTE FUNCTION count_update()`
    )
  }
  return (table: string, id: string) =>
    Effect.map(
      sql<{ n: number }>`SELECT count(*)::int AS n FROM row_updates WHERE tbl = ${table} AND id = ${id}`,
      (rows) => rows[0]!.n
    )
}).pipe(Effect.orDie)

/** The rows as folded so far, without the queue's count. */
const rawRows = (keyId: string) => Effect.map(keyRows(keyId), ({ queued: _, ...rows }) => rows)

const unfolded = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [row] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM credit_unfolded`
  return row!.n
}).pipe(Effect.orDie)

describe("folding credit captures into the key's and the owner's rows", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "N captures update each row N + 1 times (the reservations and one fold), and the readers never lag",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const key = yield* fundedKey({ budget: 1_000_000, balance: 2_000_000 })
          const updates = yield* countUpdates
          const release = yield* holdFolds
          const n = 20
          for (let i = 0; i < n; i++) yield* paidRequest(ledger, key, `fold_${i}`)

          // Not folded: the rows still hold every worst case (the safe direction)...
          assert.deepStrictEqual(yield* rawRows(key.keyId), {
            spent: 0,
            reserved: n * AUTHORIZED,
            available: 2_000_000 - n * AUTHORIZED,
            walletReserved: n * AUTHORIZED
          })
          // ...and what readers see counts the captures: exactly the settled figures.
          const settled = {
            budget: 1_000_000,
            spent: n * CHARGED,
            reserved: 0,
            available: 2_000_000 - n * CHARGED,
            walletReserved: 0
          }
          assert.deepStrictEqual(yield* keyState(key.keyId), settled)
          assert.strictEqual(
            (yield* ledger.reserveCredit(record("fold_open"), key.keyId)).keyRemaining,
            1_000_000 - n * CHARGED - AUTHORIZED
          )
          yield* ledger.release({
            receipt: {
              ...receiptOf("fold_open", key.wallet),
              charged: 0,
              status: "released",
              settlement: "none"
            },
            economics: seededEconomics("fold_open"),
            source: { _tag: "Credit", keyId: key.keyId }
          })
          // The reservations, one each; no capture or release touched either row.
          assert.strictEqual(yield* updates("api_keys", key.keyId), n + 1)
          assert.strictEqual(yield* updates("wallet_balances", key.wallet), n + 1)
          assert.strictEqual(yield* unfolded, n + 1)

          yield* release
          yield* ledger.foldCredit
          assert.strictEqual(yield* unfolded, 0)
          assert.deepStrictEqual(yield* rawRows(key.keyId), {
            spent: settled.spent,
            reserved: 0,
            available: settled.available,
            walletReserved: 0
          })
          assert.deepStrictEqual(yield* keyState(key.keyId), settled)
          // One fold statement took all n + 1: one more update of each row, not n + 1.
          assert.strictEqual(yield* updates("api_keys", key.keyId), n + 2)
          assert.strictEqual(yield* updates("wallet_balances", key.wallet), n + 2)
        })
    )

    it.effect(
      "a session funded by a key: opening, close and a released opening settle the key as before",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          const budget = SESSION_BUDGET
          const openSession = (sessionId: string, requestId: string) =>
            openKeySession(key, sessionId, requestId)
          const opening = (sessionId: string, requestId: string, charged: number) =>
            sessionOpening(key, sessionId, requestId, charged)
          const release = yield* holdFolds

          // Served: the budget stays reserved on the key until the session closes; nothing is queued.
          yield* openSession("s_served", "open_served")
          yield* ledger.capture(opening("s_served", "open_served", CHARGED))
          assert.strictEqual(yield* unfolded, 0)
          assert.deepStrictEqual(yield* keyState(key.keyId), {
            budget: 1_000_000,
            spent: 0,
            reserved: budget,
            available: 1_000_000 - budget,
            walletReserved: budget
          })
          assert.isTrue(yield* ledger.closeSession("s_served", false, 1))
          const closed = {
            budget: 1_000_000,
            spent: CHARGED,
            reserved: 0,
            available: 1_000_000 - CHARGED,
            walletReserved: 0
          }
          // The close queues its remainder for the fold (D402): the rows still hold the budget, readers see
          // it settled.
          assert.strictEqual(yield* unfolded, 1)
          assert.deepStrictEqual(yield* rawRows(key.keyId), {
            spent: 0,
            reserved: budget,
            available: 1_000_000 - budget,
            walletReserved: budget
          })
          assert.deepStrictEqual(yield* keyState(key.keyId), closed)

          // Never served: the opening's release goes back whole through the fold.
          yield* openSession("s_failed", "open_failed")
          yield* ledger.release({
            ...opening("s_failed", "open_failed", 0),
            receipt: {
              ...opening("s_failed", "open_failed", 0).receipt,
              status: "released",
              settlement: "none"
            }
          })
          assert.strictEqual(yield* unfolded, 2)
          assert.deepStrictEqual(yield* keyState(key.keyId), closed)
          yield* release
          yield* ledger.foldCredit
          assert.strictEqual(yield* unfolded, 0)
          assert.deepStrictEqual(yield* rawRows(key.keyId), {
            spent: CHARGED,
            reserved: 0,
            available: 1_000_000 - CHARGED,
            walletReserved: 0
          })
          const sessions = yield* sql<{
            n: number
          }>`SELECT count(*)::int AS n FROM sessions WHERE session_id = 's_failed'`
          assert.strictEqual(sessions[0]!.n, 0)
        })
    )

    it.effect(
      "a session close locks neither the key's row nor the balance's: a writer taking them in the other order never deadlocks it",
      () =>
        Effect.scoped(
          Effect.gen(function* () {
            const ledger = yield* Ledger
            const sql = yield* SqlClient.SqlClient
            const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
            yield* openKeySession(key, "s_locked", "open_locked")
            yield* ledger.capture(sessionOpening(key, "s_locked", "open_locked", CHARGED))
            // No fold meanwhile: it would take the same two rows.
            const release = yield* holdFolds
            // Another writer locks the owner's balance row, then the key's (an order the fold's plan may take).
            const balanceHeld = yield* Deferred.make<void>()
            const takeKey = yield* Deferred.make<void>()
            const writer = yield* Effect.forkScoped(
              sql.withTransaction(
                Effect.gen(function* () {
                  yield* sql`SELECT 1 FROM wallet_balances WHERE wallet = ${key.wallet} FOR UPDATE`
                  yield* Deferred.succeed(balanceHeld, undefined)
                  yield* Deferred.await(takeKey)
                  yield* sql`SELECT 1 FROM api_keys WHERE key_id = ${key.keyId} FOR UPDATE`
                })
              )
            )
            yield* Deferred.await(balanceHeld)
            const close = yield* Effect.forkScoped(Effect.exit(ledger.closeSession("s_locked", false, 1)))
            // The close is done, or waits on a row lock (a close that took the key's row would wait here).
            yield* lockWaited(() => close.pollUnsafe() !== undefined)
            yield* Deferred.succeed(takeKey, undefined)
            const closed = yield* Fiber.join(close)
            const written = yield* Fiber.await(writer)
            assert.isTrue(Exit.isSuccess(closed) && closed.value, String(closed))
            assert.isTrue(Exit.isSuccess(written), String(written))
            yield* release
            yield* ledger.foldCredit
            assert.deepStrictEqual(yield* rawRows(key.keyId), {
              spent: CHARGED,
              reserved: 0,
              available: 1_000_000 - CHARGED,
              walletReserved: 0
            })
          })
        )
    )

    it.effect("a withdrawal of the whole balance readers see folds first, so it is not refused", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const wallets = yield* Wallets
        const key = yield* fundedKey({ budget: 1_000_000, balance: 100_000 })
        const release = yield* holdFolds
        yield* paidRequest(ledger, key, "before_withdrawal")
        const { available } = yield* wallets.balance(key.wallet)
        assert.strictEqual(available, 100_000 - CHARGED)
        // The debit waits for the fold the test holds up; the row alone would not cover it.
        const withdrawal = yield* Effect.forkScoped(
          wallets.debitWithdrawal({
            withdrawalId: "wd_fold",
            wallet: key.wallet,
            to: key.wallet,
            amount: available,
            nonce: "fold-1"
          })
        )
        // It is waiting for the fold's lock (a debit that did not fold first would have been refused by now).
        const sql = yield* SqlClient.SqlClient
        yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`.pipe(
          Effect.repeat({ until: (rows) => rows[0]!.n > 0 || withdrawal.pollUnsafe() !== undefined }),
          Effect.orDie
        )
        yield* release
        assert.strictEqual(yield* Fiber.join(withdrawal), "debited")
        assert.deepStrictEqual(yield* rawRows(key.keyId), {
          spent: CHARGED,
          reserved: 0,
          available: 0,
          walletReserved: 0
        })
      })
    )

    it.effect("instances folding at once while captures go on never apply a capture twice", () =>
      Effect.scoped(
        Effect.gen(function* () {
          const ledger = yield* Ledger
          // A second router instance on the same database, with its own background fold.
          const second = Context.get(yield* Layer.build(Ledger.layer), Ledger)
          const keys = yield* Effect.forEach([1, 2, 3], () =>
            fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          )
          const perKey = 30
          const folds = Effect.forEach([ledger, second, ledger, second], (l) => l.foldCredit, {
            concurrency: "unbounded"
          }).pipe(Effect.repeat({ times: 15 }))
          const captures = Effect.forEach(
            keys.flatMap((key, k) =>
              Array.from({ length: perKey }, (_, i) => ({ key, id: `c_${k}_${i}`, i }))
            ),
            ({ key, id, i }) => paidRequest(i % 2 === 0 ? ledger : second, key, id),
            { concurrency: 8 }
          )
          yield* Effect.all([captures, folds], { concurrency: "unbounded" })
          yield* ledger.foldCredit
          assert.strictEqual(yield* unfolded, 0)
          for (const key of keys) {
            assert.deepStrictEqual(yield* rawRows(key.keyId), {
              spent: perKey * CHARGED,
              reserved: 0,
              available: 10_000_000 - perKey * CHARGED,
              walletReserved: 0
            })
          }
        })
      )
    )
  })
})

/**
 * The fold's cadence (D318): while this instance captures, a pass every 50 ms folds what it queued; an idle
 * instance sends a fold statement only once per 2 s sweep (at 50 ms it sent twenty a second). Counted as the
 * fold statements the router's SQL spans show.
 */
const exporter = new InMemorySpanExporter()
const TracedLedger = LedgerLayer.pipe(Layer.provide(tracingWith([new SimpleSpanProcessor(exporter)])))
/** Fold statements that started at or after `fromNanos` (the clock the router's spans are timed by) and ended. */
const foldStatementsSince = (fromNanos: bigint) =>
  exporter
    .getFinishedSpans()
    .filter((span) => /DELETE FROM credit_unfolded/.test(String(span.attributes["db.query.text"] ?? "")))
    .filter((span) => BigInt(span.startTime[0]) * 1_000_000_000n + BigInt(span.startTime[1]) >= fromNanos)
    .length

describe("the fold's cadence", () => {
  layer(TracedLedger, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("an idle ledger folds once per sweep; a capture here is folded by the next passes", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        yield* Effect.sleep("300 millis")
        // Counted by when each statement started, over the window as long as it really was: a pass that
        // started before it (and ended in it), or a sleep a loaded machine stretched past the next sweep,
        // counted a second statement in "1.5 s" while the sweeps were still 2 s apart.
        const from = yield* Clock.currentTimeNanos
        yield* Effect.sleep("1500 millis")
        const windowMs = Number((yield* Clock.currentTimeNanos) - from) / 1e6
        const idle = foldStatementsSince(from)
        const sweeps = 1 + Math.floor(windowMs / 2_000)
        assert.isAtMost(idle, sweeps, `fold statements in ${Math.round(windowMs)} ms of idle: ${idle}`)

        const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        yield* paidRequest(ledger, key, `cadence_${key.keyId}`)
        const sql = yield* SqlClient.SqlClient
        const queued = sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM credit_unfolded WHERE key_id = ${key.keyId}`
        // Folded by the background passes the capture woke, well inside one sweep interval.
        let waited = 0
        while ((yield* queued)[0]!.n > 0 && waited < 1_000) {
          yield* Effect.sleep("50 millis")
          waited += 50
        }
        assert.strictEqual((yield* queued)[0]!.n, 0, "the capture was folded within 1 s")
      }).pipe(Effect.orDie)
    )
  })
})
