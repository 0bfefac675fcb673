import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { randomAuthorizationNonce, signTransferAuthorization } from "../../src/chain/Eip3009.ts"
import { Authorizations } from "../../src/ledger/Authorizations.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { Settlement } from "../../src/payment/Settlement.ts"
import { submit } from "../support/ChainSend.ts"
import { routerLayer } from "../support/Router.ts"

describe("settlement", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "an authorization that already landed (a lost receipt wait) is recorded as landed, not failed",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const sql = yield* SqlClient.SqlClient
          const account = privateKeyToAccount(chain.demoWallets[3]!.privateKey!)
          const authorization = {
            from: account.address,
            to: chain.treasury,
            value: 20_000n,
            validAfter: 0n,
            validBefore: BigInt(Math.floor(Date.now() / 1000) + 3600),
            nonce: randomAuthorizationNonce()
          }
          const signature = yield* Effect.promise(() =>
            signTransferAuthorization(account, {
              token: chain.token,
              chainId: chain.chainId,
              domain: chain.tokenDomain,
              ...authorization
            })
          )
          // The first attempt's transfer landed, but the wait for its receipt failed: the row went back
          // to `pending` without a hash. A second submission would fail at gas estimation.
          const hash = yield* submit(chain, { ...authorization, signature })
          assert.strictEqual((yield* chain.waitForReceipt(hash)).status, "success")
          const payer = account.address.toLowerCase()
          yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                         provider_id, authorized, charged, status)
                   VALUES ('req_lost_wait', 'openai', 'x402', ${payer}, 'auto', 'chat-small', 'p', 20000, 100, 'captured')`
          yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before, signature,
                                                    status, attempts)
                   VALUES (${payer}, ${authorization.nonce}, 'req_lost_wait', 20000, 0,
                           ${authorization.validBefore.toString()}, ${signature}, 'pending', 1)`
          const settlement = yield* Settlement
          yield* settlement.runOnce
          const rows = yield* sql<{ status: string; signature: string | null }>`
          SELECT status, signature FROM x402_authorizations WHERE request_id = 'req_lost_wait'`
          assert.deepStrictEqual(rows[0], { status: "landed", signature: null })
          const settled = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM ledger_entries WHERE request_id = 'req_lost_wait' AND kind = 'settled'`
          assert.strictEqual(settled[0]!.n, 1)
          // A late second landing (a claim that no longer holds the row) writes nothing: the landing is one
          // statement whose ledger row exists only when the authorization's own update matched (D333).
          const authorizations = yield* Authorizations
          const again = yield* authorizations.recordLanded(
            {
              payer,
              nonce: authorization.nonce,
              request_id: "req_lost_wait",
              value: "20000",
              valid_after: "0",
              valid_before: authorization.validBefore.toString(),
              signature,
              tx_hash: hash,
              attempts: 1,
              scheme: "exact",
              ceiling: null
            },
            hash
          )
          assert.isFalse(again)
          const still = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM ledger_entries WHERE request_id = 'req_lost_wait' AND kind = 'settled'`
          assert.strictEqual(still[0]!.n, 1)
        })
    )
  })
})

describe("settlement's look for stale claims", () => {
  it.effect("runs on the first pass and then every 30 s, not on every 250 ms pass", () =>
    Effect.gen(function* () {
      let recovered = 0
      const unused = Effect.die("not reached: no authorization is due")
      const settlement = yield* Settlement.make.pipe(
        Effect.provideService(
          Authorizations,
          Authorizations.of({
            recover: Effect.sync(() => {
              recovered++
            }),
            claimDue: Effect.succeed([]),
            releaseClaimsOf: () => unused,
            recordBroadcast: () => unused,
            recordLanded: () => unused,
            recordFailed: () => unused
          })
        ),
        // Only a claimed authorization reaches the chain, the ledger or the treasury.
        Effect.provideService(Chain, {} as Chain["Service"]),
        Effect.provideService(Ledger, {} as Ledger["Service"]),
        Effect.provideService(Treasury, {} as Treasury["Service"])
      )
      yield* settlement.runOnce
      yield* settlement.runOnce
      assert.strictEqual(recovered, 1)
      yield* TestClock.adjust("29 seconds")
      yield* settlement.runOnce
      assert.strictEqual(recovered, 1)
      yield* TestClock.adjust("1 second")
      yield* settlement.runOnce
      assert.strictEqual(recovered, 2)
    })
  )
})
