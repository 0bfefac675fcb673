import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { Authorizations, CLAIM_LIMIT } from "../../src/ledger/Authorizations.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { MAX_PASSES, Settlement } from "../../src/payment/Settlement.ts"
import { nodeCall } from "../support/ChainSend.ts"
import { TestDatabase } from "../support/Database.ts"
import { signedTransfer } from "../support/Pay.ts"

/** Real time: the loop's 250 ms and the treasury's polls are the clock's. */
const sleep = (ms: number) => Effect.promise(() => new Promise((resolve) => setTimeout(resolve, ms)))

const until = <A>(
  what: string,
  probe: Effect.Effect<A | undefined, never, SqlClient.SqlClient>,
  seconds = 30
) =>
  Effect.gen(function* () {
    for (let i = 0; i < seconds * 10; i++) {
      const value = yield* probe
      if (value !== undefined) return value
      yield* sleep(100)
    }
    return assert.fail(`timed out waiting for ${what}`)
  })

const N = 2 * CLAIM_LIMIT + 8

/** `N` signed authorizations of the demo wallets, captured and due for settlement. */
const queue = Effect.gen(function* () {
  const chain = yield* Chain
  const sql = yield* SqlClient.SqlClient
  for (let i = 0; i < N; i++) {
    const account = privateKeyToAccount(chain.demoWallets[i % 4]!.privateKey!)
    const { authorization, signature } = yield* signedTransfer(account, 1_000n)
    const payer = account.address.toLowerCase()
    const id = `req_passes_${i}`
    yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                     provider_id, authorized, charged, status)
               VALUES (${id}, 'openai', 'x402', ${payer}, 'auto', 'chat-small', 'p', 1000, 100, 'captured')`
    yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                                signature, status, attempts)
               VALUES (${payer}, ${authorization.nonce}, ${id}, 1000, 0, ${authorization.validBefore.toString()},
                       ${signature}, 'pending', 0)`
  }
})

const count = (where: "sent" | "landed") =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      where === "sent"
        ? sql<{ n: number }>`SELECT count(*)::int AS n FROM x402_authorizations WHERE tx_hash IS NOT NULL`
        : sql<{ n: number }>`SELECT count(*)::int AS n FROM x402_authorizations WHERE status = 'landed'`,
      (rows) => rows[0]!.n
    )
  ).pipe(Effect.orDie)

const TestLayer = Layer.mergeAll(TestDatabase, Chain.layer)

describe("the settlement loop (D426)", () => {
  layer(TestLayer, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect(
      "claims again while earlier passes wait for their block: more than one claim sent before any block",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          yield* queue
          // No block until this test mines one: every pass waits for its transfers' block.
          yield* nodeCall(chain, "evm_setAutomine", [false])
          const before = yield* Effect.promise(() => chain.publicClient.getBlockNumber())
          yield* Effect.gen(function* () {
            yield* Layer.build(
              Settlement.layer.pipe(
                Layer.provide(Authorizations.layer),
                Layer.provide(Layer.effect(Treasury, Treasury.make())),
                Layer.provide(
                  Layer.succeed(Ledger, {
                    signLater: () => Effect.void,
                    finalizeReceipt: () => Effect.void
                  } as unknown as Ledger["Service"])
                )
              )
            )
            // One pass claims at most `CLAIM_LIMIT`; a loop that waited for each pass's block would stop there.
            yield* until(
              `all ${N} sent with no block mined`,
              Effect.map(count("sent"), (n) => (n === N ? n : undefined))
            )
            assert.strictEqual(yield* Effect.promise(() => chain.publicClient.getBlockNumber()), before)
            assert.strictEqual(yield* count("landed"), 0)
            // One block carries them all, and every waiting pass records its landings.
            yield* nodeCall(chain, "evm_mine")
            yield* until(
              `all ${N} landed`,
              Effect.map(count("landed"), (n) => (n === N ? n : undefined))
            )
          }).pipe(Effect.scoped)
          assert.isAtLeast(MAX_PASSES, Math.ceil(N / CLAIM_LIMIT))
        })
    )
  })
})
