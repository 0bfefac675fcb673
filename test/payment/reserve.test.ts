import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { randomAuthorizationNonce } from "../../src/chain/Eip3009.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
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
          assert.isFalse(yield* ledger.nonceUnused(record("x").payer, hold.nonce))
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

describe("a key's reservation with the winner's capacity lease (D311)", () => {
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
          capacity: 1
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
  })
})
