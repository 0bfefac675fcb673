import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Reaper } from "../../src/ledger/Reaper.ts"
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
  })
})
