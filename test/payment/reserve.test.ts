import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { randomAuthorizationNonce } from "../../src/chain/Eip3009.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { TestDatabase } from "../support/Database.ts"

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
