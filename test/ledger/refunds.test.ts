import { assert, describe, it, layer } from "@effect/vitest"
import { Clock, Effect, Layer, Metric } from "effect"
import { SqlClient } from "effect/sql"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { Chain, randomAuthorizationNonce } from "../../src/chain/Chain.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import {
  makeRefunds,
  REFUND_RETRY_MAX_MS,
  refundRetryDelayMs,
  refundsUnpayable
} from "../../src/ledger/Refunds.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { RouterConfig } from "../../src/RouterConfig.ts"
import { TestDatabase } from "../support/Database.ts"
import { fundTreasury } from "./support.ts"

const TestLayer = Layer.mergeAll(Ledger.layer, Treasury.layer).pipe(
  Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)),
  Layer.provideMerge(RouterConfig.layerTest({ epochSeconds: 2 }))
)

/** A clock whose time the test moves by hand: only the refunds' backoff reads it. */
const handClock = (start: number) => {
  let now = start
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: () => now,
    currentTimeMillis: Effect.sync(() => now),
    currentTimeNanosUnsafe: () => BigInt(now) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => BigInt(now) * 1_000_000n),
    monotonicTimeNanosUnsafe: () => BigInt(now) * 1_000_000n,
    monotonicTimeNanos: Effect.sync(() => BigInt(now) * 1_000_000n),
    sleep: () => Effect.void
  }
  return { clock, advance: (ms: number) => (now += ms) }
}

/** A captured x402 call whose payment landed, with `amount` due back to a fresh payer. */
const seedDueRefund = (amount: bigint) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const payer = privateKeyToAccount(generatePrivateKey()).address.toLowerCase()
    const requestId = `req_refund_${payer.slice(2, 10)}`
    yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                     provider_id, authorized, charged, status)
               VALUES (${requestId}, 'openai', 'x402', ${payer}, 'chat-small', 'chat-small', 'prov-refund',
                       ${amount + 1n}, 1, 'captured')`
    yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                                status, tx_hash)
               VALUES (${payer}, ${randomAuthorizationNonce()}, ${requestId}, ${amount + 1n}, 0, ${2 ** 40},
                       'landed', ${`0x${"ab".repeat(32)}`})`
    yield* sql`INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
               VALUES (${requestId}, ${payer}, ${amount}, 1, 'due')`
    return { payer, requestId }
  }).pipe(Effect.orDie)

describe("refund batches the treasury cannot cover", () => {
  it("the retry delay doubles from 1 s and stops growing at its bound", () => {
    assert.deepStrictEqual([1, 2, 3, 4].map(refundRetryDelayMs), [1_000, 2_000, 4_000, 8_000])
    assert.strictEqual(refundRetryDelayMs(40), REFUND_RETRY_MAX_MS)
  })

  layer(TestLayer, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("are retried with a growing backoff, counted in a gauge, and paid once funded", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const chain = yield* Chain
        const treasury = yield* Treasury
        let sends = 0
        const counting = {
          ...treasury,
          send: (t: Parameters<typeof treasury.send>[0]) => {
            sends++
            return treasury.send(t)
          }
        }
        const refunds = yield* makeRefunds({ payoutFloor: 1, currentEpoch: Effect.succeed(1_000) }).pipe(
          Effect.provideService(Treasury, counting)
        )
        const hand = handClock(1_700_000_000_000)
        const pass = refunds.settle.pipe(Effect.provideService(Clock.Clock, hand.clock))
        const amount = (yield* chain.balanceOf(chain.treasury)) + 1_000n
        const { requestId } = yield* seedDueRefund(amount)
        const status = Effect.map(
          sql<{ status: string }>`SELECT status FROM refunds WHERE request_id = ${requestId}`,
          (rows) => rows[0]!.status
        ).pipe(Effect.orDie)

        // Refused before broadcast: back to due, its amount in the gauge.
        yield* pass
        assert.strictEqual(sends, 1)
        assert.strictEqual(yield* status, "due")
        assert.strictEqual(
          yield* Metric.value(refundsUnpayable).pipe(Effect.map((s) => s.value)),
          Number(amount)
        )

        // Within the backoff (1 s, then 2 s) the batch is not tried again, however many passes run.
        yield* pass
        yield* pass
        assert.strictEqual(sends, 1)
        hand.advance(1_000)
        yield* pass
        assert.strictEqual(sends, 2)
        hand.advance(1_999)
        yield* pass
        assert.strictEqual(sends, 2)
        assert.strictEqual(yield* status, "due")

        // Funded, the next try after the backoff pays it, once; the gauge drops to zero.
        yield* fundTreasury(amount)
        hand.advance(1)
        yield* pass
        assert.strictEqual(sends, 3)
        assert.strictEqual(yield* status, "paid")
        assert.strictEqual(yield* Metric.value(refundsUnpayable).pipe(Effect.map((s) => s.value)), 0)
      })
    )
  })
})
