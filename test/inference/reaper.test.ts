import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { Reaper } from "../../src/inference/Reaper.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { call, routerLayer } from "../support/Router.ts"

describe("reservations left by a dead request", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("are released in full with a signed receipt; fresh ones are left alone", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const sql = yield* SqlClient.SqlClient
        const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const record = (requestId: string) => ({
          requestId,
          dialect: "openai",
          payer: key.wallet,
          requestedModel: "auto",
          modelClass: "chat-small",
          providerId: "p",
          authorized: 5_000,
          agent: {}
        })
        yield* ledger.reserveCredit(record("req_dead"), key.keyId)
        yield* ledger.reserveCredit(record("req_alive"), key.keyId)
        // An instance died two hours ago while serving req_dead.
        yield* sql`UPDATE requests SET created_at = now() - interval '2 hours' WHERE request_id = 'req_dead'`
        assert.strictEqual((yield* keyState(key.keyId)).reserved, 10_000)
        const reaper = yield* Reaper
        assert.strictEqual(yield* reaper.runOnce, 1)
        const state = yield* keyState(key.keyId)
        assert.deepStrictEqual([state.reserved, state.spent, state.walletReserved], [5_000, 0, 5_000])
        const statuses = yield* sql<{ request_id: string; status: string }>`
          SELECT request_id, status FROM requests ORDER BY request_id`
        assert.deepStrictEqual(
          statuses.map((r) => [r.request_id, r.status]),
          [
            ["req_alive", "reserved"],
            ["req_dead", "released"]
          ]
        )
        const receipt = (yield* call("/v1/receipts/req_dead")).json as {
          receipt: { status: string; charged: number }
          final: boolean
        }
        assert.deepStrictEqual(
          [receipt.receipt.status, receipt.receipt.charged, receipt.final],
          ["released", 0, true]
        )
        assert.strictEqual(yield* reaper.runOnce, 0)
      })
    )

    it.effect(
      "an expired session nobody closed is settled: its key reservation goes back, less what it spent",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          // A key-funded session of 10,000 that spent 2,000 and expired a minute ago.
          yield* sql`UPDATE api_keys SET reserved = 10000 WHERE key_id = ${key.keyId}`
          yield* sql`UPDATE wallet_balances SET available = available - 10000, reserved = 10000 WHERE wallet = ${key.wallet}`
          yield* sql`INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, key_id, budget,
                                         spent, provider_id, model_class, price_in, price_out, expires_at, status, turns)
                   VALUES ('s-expired', 'x', ${key.wallet}, 'credit', 'req_open', ${key.keyId}, 10000, 2000, 'p',
                           'chat-medium', 1, 1, now() - interval '1 minute', 'open', 2)`
          const reaper = yield* Reaper
          yield* reaper.runOnce
          const state = yield* keyState(key.keyId)
          assert.deepStrictEqual(
            [state.reserved, state.spent, state.walletReserved, state.available],
            [0, 2000, 0, 998_000]
          )
          const rows = yield* sql<{
            status: string
          }>`SELECT status FROM sessions WHERE session_id = 's-expired'`
          assert.strictEqual(rows[0]!.status, "closed")
        })
    )
  })
})
