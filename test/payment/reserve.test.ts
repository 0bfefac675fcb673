import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { randomAuthorizationNonce } from "../../src/chain/Eip3009.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { elapsedMs } from "../../src/process/ElapsedClock.ts"
import { TestDatabase } from "../support/Database.ts"
import { fundedKey, keyState } from "../support/Keys.ts"

const LedgerLayer = Ledger.layer.pipe(Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)))

const record = (requestId: string) => ({
  requestId,
  dialect: "openai",
  payer: "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
  requestedModel: "auto",
  modelClass: "chat-small",
  providerId: "p1",
  authorized: 10_000,
  agent: {}
})

describe("reservation", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "reserves request, authorization and ledger row at once; a replayed nonce reserves nothing",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const hold = {
            nonce: randomAuthorizationNonce(),
            validAfter: 0n,
            validBefore: 9_999_999_999n,
            signature: "0x01" as const
          }
          yield* ledger.reserveX402(record("req_a"), hold)
          const count = (table: string) =>
            Effect.map(
              sql.unsafe<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`),
              (rows) => rows[0]!.n
            )
          assert.deepStrictEqual(
            [yield* count("requests"), yield* count("x402_authorizations"), yield* count("ledger_entries")],
            [1, 1, 1]
          )
          const replay = yield* Effect.flip(ledger.reserveX402(record("req_b"), hold))
          assert.strictEqual(replay._tag, "NonceReplay")
          assert.deepStrictEqual(
            [yield* count("requests"), yield* count("x402_authorizations"), yield* count("ledger_entries")],
            [1, 1, 1]
          )
        })
    )
  })
})

describe("a database fault during a key's reservation", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "is a 503 to retry (by SQLSTATE), never a refusal to pay; the schema's refusals stay 402s",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 50_000, balance: 30_000 })
          // Real Postgres faults, raised by the server with their SQLSTATE for the payer under test.
          yield* sql.unsafe(`
          CREATE FUNCTION fault_for_model() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            IF NEW.requested_model LIKE 'fault-%' THEN
              RAISE EXCEPTION 'injected fault' USING ERRCODE = substr(NEW.requested_model, 7);
            END IF;
            RETURN NEW;
          END $$`)
          yield* sql.unsafe(
            "CREATE TRIGGER fault_for_model BEFORE INSERT ON requests FOR EACH ROW EXECUTE FUNCTION fault_for_model()"
          )
          const reserve = (requestId: string, authorized: number, requestedModel = "auto") =>
            Effect.flip(
              ledger.reserveCredit(
                { ...record(requestId), payer: key.wallet, authorized, requestedModel },
                key.keyId
              )
            )
          // Serialization failure, deadlock, admin shutdown, a lost connection: the database failed.
          for (const sqlState of ["40001", "40P01", "57P01", "08006"]) {
            const failed = yield* reserve(`req_${sqlState}`, 1_000, `fault-${sqlState}`)
            assert.strictEqual(failed._tag, "ServiceUnavailable", sqlState)
            if (failed._tag === "ServiceUnavailable") assert.strictEqual(failed.code, "database_unavailable")
          }
          // What the schema refuses is still the payer's refusal.
          const overBalance = yield* reserve("req_over_balance", 40_000)
          assert.deepStrictEqual(
            [overBalance._tag, overBalance._tag === "CreditRefused" ? overBalance.code : ""],
            ["CreditRefused", "key_unfunded"]
          )
          const overCap = yield* reserve("req_over_cap", 60_000)
          assert.deepStrictEqual(
            [overCap._tag, overCap._tag === "CreditRefused" ? overCap.code : ""],
            ["CreditRefused", "key_budget_exhausted"]
          )
          const state = yield* keyState(key.keyId)
          assert.deepStrictEqual([state.reserved, state.walletReserved, state.available], [0, 0, 30_000])
          const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM requests`
          assert.strictEqual(rows[0]!.n, 0)
        })
    )
  })
})

describe("a reservation with the winner's capacity lease (D311)", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("takes the lease in its own statement, within the quote's ceiling, and none when refused", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const sql = yield* SqlClient.SqlClient
        const key = yield* fundedKey({ budget: 100_000, balance: 100_000 })
        const lease = (leaseId: string) => ({
          leaseId,
          providerId: "p1",
          modelClass: "chat-small",
          capacity: 1,
          requestedAt: elapsedMs()
        })
        const reserve = (requestId: string, leaseId: string, authorized = 10_000) =>
          ledger.reserveCredit(
            { ...record(requestId), payer: key.wallet, authorized, lease: lease(leaseId) },
            key.keyId
          )
        const leases = Effect.map(
          sql<{ lease_id: string }>`SELECT lease_id FROM capacity_leases ORDER BY lease_id`,
          (rows) => rows.map((r) => r.lease_id)
        )
        const first = yield* reserve("req_first", "lease-1")
        assert.isTrue(first.leaseGranted)
        assert.deepStrictEqual(yield* leases, ["lease-1"])
        // The quote's ceiling (one) is reached: the reservation stands, the lease is refused.
        const second = yield* reserve("req_second", "lease-2")
        assert.isFalse(second.leaseGranted)
        assert.deepStrictEqual(yield* leases, ["lease-1"])
        // A reservation the balance refuses takes no lease, even with a slot free.
        yield* sql`DELETE FROM capacity_leases`
        const refused = yield* Effect.flip(reserve("req_refused", "lease-3", 90_000))
        assert.strictEqual(refused._tag, "CreditRefused")
        assert.deepStrictEqual(yield* leases, [])
        // Without a lease asked for, none is taken.
        const plain = yield* ledger.reserveCredit({ ...record("req_plain"), payer: key.wallet }, key.keyId)
        assert.isUndefined(plain.leaseGranted)
        assert.deepStrictEqual(yield* leases, [])
      })
    )

    it.effect("an x402 reservation takes it the same way, and none when overcommitted or replayed", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM capacity_leases`
        const hold = (nonce = randomAuthorizationNonce()) => ({
          nonce,
          validAfter: 0n,
          validBefore: 9_999_999_999n,
          signature: "0x01" as const,
          balance: 25_000n
        })
        const lease = (leaseId: string) => ({
          leaseId,
          providerId: "p2",
          modelClass: "chat-small",
          capacity: 1,
          requestedAt: elapsedMs()
        })
        const leases = Effect.map(
          sql<{ lease_id: string }>`SELECT lease_id FROM capacity_leases ORDER BY lease_id`,
          (rows) => rows.map((r) => r.lease_id)
        )
        const first = hold()
        const granted = yield* ledger.reserveX402({ ...record("req_x1"), lease: lease("x-1") }, first)
        assert.isTrue(granted.leaseGranted)
        assert.deepStrictEqual(yield* leases, ["x-1"])
        const atCeiling = yield* ledger.reserveX402({ ...record("req_x2"), lease: lease("x-2") }, hold())
        assert.isFalse(atCeiling.leaseGranted)
        yield* sql`DELETE FROM capacity_leases`
        // 20,000 of the 25,000 are committed: another 10,000 is refused, and takes no lease.
        const over = yield* Effect.flip(
          ledger.reserveX402({ ...record("req_x3"), lease: lease("x-3") }, hold())
        )
        assert.deepStrictEqual(
          [over._tag, over._tag === "NonceReplay" ? over.reason : ""],
          ["NonceReplay", "overcommitted"]
        )
        const replay = yield* Effect.flip(
          ledger.reserveX402({ ...record("req_x4"), authorized: 1_000, lease: lease("x-4") }, first)
        )
        assert.deepStrictEqual(
          [replay._tag, replay._tag === "NonceReplay" ? replay.reason : ""],
          ["NonceReplay", "nonce_replay"]
        )
        assert.deepStrictEqual(yield* leases, [])
      })
    )
  })
})

describe("an x402 payer's balance, committed once (D327)", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    const payer = "0x90F79bf6EB2c4f870365E785982E1f101E93b906"
    const hold = (balance: bigint) => ({
      nonce: randomAuthorizationNonce(),
      validAfter: 0n,
      validBefore: 9_999_999_999n,
      signature: "0x01" as const,
      balance
    })
    const reserve = (requestId: string, authorized: number, balance: bigint) =>
      Ledger.use((ledger) =>
        ledger.reserveX402({ ...record(requestId), payer, authorized }, hold(balance)).pipe(
          Effect.as("reserved" as const),
          Effect.catchTag("NonceReplay", (refused) => Effect.succeed(refused.reason ?? "nonce_replay"))
        )
      )
    /** The row the reservation checks, and the sum it stands for. */
    const committed = Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const [row] = yield* sql<{ outstanding: string | null; sum: string }>`
        SELECT (SELECT outstanding::text FROM x402_outstanding WHERE payer = ${payer.toLowerCase()}) AS outstanding,
               (SELECT coalesce(sum(value), 0)::text FROM x402_authorizations
                WHERE payer = ${payer.toLowerCase()} AND status IN ('reserved', 'pending', 'submitted')) AS sum`
      return { outstanding: Number(row!.outstanding ?? 0), sum: Number(row!.sum) }
    })

    it.effect("concurrent authorizations beyond the balance are refused, whatever their order", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        // Every reservation starts (and takes its snapshot) while another transaction holds the payer's
        // row, then they go one by one: each must see what the ones before it committed.
        yield* sql`INSERT INTO x402_outstanding (payer, outstanding) VALUES (${payer.toLowerCase()}, 0)`
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const holder = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`SELECT 1 FROM x402_outstanding WHERE payer = ${payer.toLowerCase()} FOR UPDATE`
              yield* Deferred.succeed(locked, undefined)
              yield* Deferred.await(release)
            })
          )
          .pipe(Effect.forkChild)
        yield* Deferred.await(locked)
        const racing = yield* Effect.all(
          Array.from({ length: 8 }, (_, i) => reserve(`req_race_${i}`, 10_000, 35_000n)),
          { concurrency: "unbounded" }
        ).pipe(Effect.forkChild)
        // Each reservation opens a pool connection of its own before it reaches the row: on a loaded machine
        // eight new connections can take longer than any fixed pause, so wait until all eight are waiting.
        const waiting = sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`
        let lockWaiters = 0
        for (let i = 0; i < 300 && lockWaiters !== 8; i++) {
          if (i > 0) yield* Effect.sleep("100 millis")
          lockWaiters = (yield* waiting)[0]!.n
        }
        assert.strictEqual(lockWaiters, 8, "all eight wait on the payer's row")
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        const outcomes = yield* Fiber.join(racing)
        assert.strictEqual(outcomes.filter((o) => o === "reserved").length, 3)
        assert.strictEqual(outcomes.filter((o) => o === "overcommitted").length, 5)
        assert.deepStrictEqual(yield* committed, { outstanding: 30_000, sum: 30_000 })
        // A refusal wrote nothing: no request, no authorization, no ledger row.
        const [counts] = yield* sql<{ requests: number; entries: number }>`
          SELECT (SELECT count(*)::int FROM requests WHERE request_id LIKE 'req_race_%') AS requests,
                 (SELECT count(*)::int FROM ledger_entries WHERE request_id LIKE 'req_race_%') AS entries`
        assert.deepStrictEqual(counts, { requests: 3, entries: 3 })
      })
    )

    it.effect("what settles, fails or is released frees the balance; a replay commits nothing", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const setStatus = (requestId: string, status: string) =>
          sql`UPDATE x402_authorizations SET status = ${status} WHERE request_id = ${requestId}`
        // 30,000 are committed by the test before (three of its eight); 40,000 leaves room for 10,000.
        const won = (yield* sql<{ request_id: string }>`
          SELECT request_id FROM x402_authorizations WHERE request_id LIKE 'req_race_%' ORDER BY request_id`).map(
          (row) => row.request_id
        )
        assert.strictEqual(won.length, 3)
        assert.strictEqual(yield* reserve("req_t1", 10_000, 40_000n), "reserved")
        assert.strictEqual(yield* reserve("req_t2", 1, 40_000n), "overcommitted")
        // Captured (pending) and claimed (submitted) stay committed: they have not moved money yet.
        yield* setStatus(won[0]!, "pending")
        yield* setStatus(won[0]!, "submitted")
        assert.strictEqual(yield* reserve("req_t3", 1, 40_000n), "overcommitted")
        // Landed, released and failed free their value.
        yield* setStatus(won[0]!, "landed")
        yield* setStatus(won[1]!, "released")
        assert.deepStrictEqual(yield* committed, { outstanding: 20_000, sum: 20_000 })
        assert.strictEqual(yield* reserve("req_t4", 20_000, 40_000n), "reserved")
        assert.strictEqual(yield* reserve("req_t5", 1, 40_000n), "overcommitted")
        // An upto capture settles its charge, not its ceiling: the difference is freed.
        yield* sql`UPDATE x402_authorizations SET status = 'pending', value = 4000 WHERE request_id = 'req_t4'`
        assert.deepStrictEqual(yield* committed, { outstanding: 24_000, sum: 24_000 })
        yield* setStatus("req_t1", "failed")
        yield* sql`DELETE FROM ledger_entries WHERE request_id = ${won[2]!}`
        yield* sql`DELETE FROM x402_authorizations WHERE request_id = ${won[2]!}`
        assert.deepStrictEqual(yield* committed, { outstanding: 4_000, sum: 4_000 })
        // A replayed nonce fails on the primary key; the balance it was checked against is untouched.
        const replayed = hold(1_000_000n)
        yield* Ledger.use((ledger) =>
          ledger.reserveX402({ ...record("req_r1"), payer, authorized: 1_000 }, replayed)
        )
        const replay = yield* Effect.flip(
          Ledger.use((ledger) =>
            ledger.reserveX402({ ...record("req_r2"), payer, authorized: 1_000 }, replayed)
          )
        )
        assert.strictEqual(replay._tag === "NonceReplay" ? replay.reason : replay._tag, "nonce_replay")
        assert.deepStrictEqual(yield* committed, { outstanding: 5_000, sum: 5_000 })
      })
    )

    it.effect(
      "a reservation writes its payer's row once; a move that keeps the value committed writes nothing (D442, D443)",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          /**
           * What `effect`, run in one transaction, wrote into the payer's table (row versions inserted or updated)
           * and how often it ran the trigger's function. The backend's counts are read before and after in the
           * transaction: they may still hold earlier ones.
           */
          const count = Effect.map(
            sql<{ rows: number; calls: number }>`
            SELECT (SELECT (n_tup_ins + n_tup_upd)::int FROM pg_stat_xact_user_tables
                    WHERE relname = 'x402_outstanding') AS rows,
                   coalesce((SELECT calls::int FROM pg_stat_xact_user_functions
                             WHERE funcname = 'x402_outstanding_track'), 0) AS calls`,
            (rows) => rows[0]!
          )
          const writes = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
            sql.withTransaction(
              Effect.gen(function* () {
                yield* sql`SET LOCAL track_functions = 'pl'`
                const start = yield* count
                yield* effect
                const end = yield* count
                return { rows: end.rows - start.rows, calls: end.calls - start.calls }
              })
            )
          const before = yield* committed
          // With a balance to check, and without one: either way one write.
          for (const [requestId, balance] of [
            ["req_w1", 1_000_000n],
            ["req_w2", undefined]
          ] as const) {
            const wrote = yield* writes(
              Ledger.use((ledger) =>
                ledger.reserveX402(
                  { ...record(requestId), payer, authorized: 1_000 },
                  { ...hold(0n), balance }
                )
              )
            )
            assert.deepStrictEqual(wrote, { rows: 1, calls: 0 }, requestId)
          }
          assert.deepStrictEqual(yield* committed, {
            outstanding: before.sum + 2_000,
            sum: before.sum + 2_000
          })
          // Captured, then claimed for submission: still committed, nothing written.
          const moved = yield* writes(
            Effect.andThen(
              sql`UPDATE x402_authorizations SET status = 'pending' WHERE request_id = 'req_w1'`,
              sql`UPDATE x402_authorizations SET status = 'submitted' WHERE request_id = 'req_w1'`
            )
          )
          assert.deepStrictEqual(moved, { rows: 0, calls: 0 })
          // An authorization written by anyone but the reservation is counted by the trigger, once.
          yield* sql`
          INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class, provider_id,
                                authorized, status)
          VALUES ('req_w3', 'openai', 'x402', ${payer.toLowerCase()}, 'auto', 'chat-small', 'p1', 3000, 'reserved')`
          const direct = yield* writes(sql`
          INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before, status)
          VALUES (${payer.toLowerCase()}, ${randomAuthorizationNonce()}, 'req_w3', 3000, 0, 9999999999, 'reserved')`)
          assert.deepStrictEqual(direct, { rows: 1, calls: 1 })
          assert.deepStrictEqual(yield* committed, {
            outstanding: before.sum + 5_000,
            sum: before.sum + 5_000
          })
          yield* sql`UPDATE x402_authorizations SET status = 'landed' WHERE request_id IN ('req_w1', 'req_w3')`
          assert.deepStrictEqual(yield* committed, {
            outstanding: before.sum + 1_000,
            sum: before.sum + 1_000
          })
        })
    )
  })
})
