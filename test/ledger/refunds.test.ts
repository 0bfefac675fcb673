import { assert, describe, it, layer } from "@effect/vitest"
import { Clock, Effect, Layer, Metric } from "effect"
import { SqlClient } from "effect/sql"
import { createTestClient, encodeAbiParameters, type Hex, http, keccak256, publicActions, toHex } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { Chain, randomAuthorizationNonce } from "../../src/chain/Chain.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import {
  makeRefunds,
  REFUND_RETRY_MAX_MS,
  refundRetryDelayMs,
  refundsUnpayable
} from "../../src/ledger/Refunds.ts"
import { Treasury, type TreasuryShape } from "../../src/ledger/Treasury.ts"
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

/**
 * The treasury's `send`, through which every transfer reverts on the real chain: with automine off the
 * transfer is estimated, signed and broadcast as usual; then the sender's token balance (TestUSDC's
 * `balanceOf`, storage slot 1) is set to 0 for the one block that mines it, and put back after.
 */
const revertingSends = (treasury: TreasuryShape, counter: { sends: number }) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const anvil = createTestClient({ mode: "anvil", transport: http(chain.rpcUrl) }).extend(publicActions)
    const slot = keccak256(encodeAbiParameters([{ type: "address" }, { type: "uint256" }], [chain.payer, 1n]))
    const setSlot = (value: Hex) =>
      Effect.promise(() => anvil.setStorageAt({ address: chain.token, index: slot, value }))
    return {
      ...treasury,
      send: (transfer: Parameters<typeof treasury.send>[0]) =>
        Effect.acquireUseRelease(
          Effect.promise(() => anvil.setAutomine(false)),
          () =>
            Effect.gen(function* () {
              counter.sends++
              const hash = yield* treasury.send(transfer)
              const balance = yield* Effect.promise(() => anvil.getStorageAt({ address: chain.token, slot }))
              yield* setSlot(toHex(0, { size: 32 }))
              yield* Effect.promise(() => anvil.mine({ blocks: 1 }))
              yield* setSlot(balance ?? toHex(0, { size: 32 }))
              return hash
            }),
          () => Effect.promise(() => anvil.setAutomine(true))
        )
    }
  })

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

    it.effect(
      "40,000 refunds due to one payer, more than a statement has bind parameters, go in one transfer (D556)",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const chain = yield* Chain
          const refunds = yield* makeRefunds({ payoutFloor: 1, currentEpoch: Effect.succeed(1_000) })
          const payer = privateKeyToAccount(generatePrivateKey()).address.toLowerCase()
          const count = 40_000
          yield* fundTreasury(BigInt(count))
          yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                         provider_id, authorized, charged, status)
                   SELECT 'req_many_' || g, 'openai', 'x402', ${payer}, 'chat-small', 'chat-small', 'prov-refund',
                          2, 1, 'captured'
                   FROM generate_series(1, ${count}) g`
          yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                                    status, tx_hash)
                   SELECT ${payer}, '0x' || lpad(to_hex(g), 64, '0'), 'req_many_' || g, 2, 0, ${2 ** 40}, 'landed',
                          ${`0x${"ab".repeat(32)}`}
                   FROM generate_series(1, ${count}) g`
          yield* sql`INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
                   SELECT 'req_many_' || g, ${payer}, 1, 1, 'due' FROM generate_series(1, ${count}) g`
          // Planned as after a busy hour, once autovacuum has analyzed the tables.
          yield* sql`ANALYZE requests, x402_authorizations, refunds`
          yield* refunds.settle
          const [row] = yield* sql<{ paid: number; booked: string }>`
          SELECT (SELECT count(*)::int FROM refunds WHERE payer = ${payer} AND status = 'paid') AS paid,
                 (SELECT coalesce(sum(amount), 0)::text FROM ledger_entries
                  WHERE account = ${payer} AND kind = 'refund_paid') AS booked`
          assert.deepStrictEqual(row, { paid: count, booked: String(count) })
          assert.strictEqual(yield* chain.balanceOf(payer as Hex), BigInt(count))
        }).pipe(Effect.orDie)
    )

    it.effect("whose transfer is sent and reverts back off like one that was never sent", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const treasury = yield* Treasury
        const counter = { sends: 0 }
        const reverting = yield* revertingSends(treasury, counter)
        const make = (service: TreasuryShape) =>
          makeRefunds({ payoutFloor: 1, currentEpoch: Effect.succeed(1_000) }).pipe(
            Effect.provideService(Treasury, service)
          )
        const refunds = yield* make(reverting)
        const hand = handClock(1_700_000_000_000)
        const pass = refunds.settle.pipe(Effect.provideService(Clock.Clock, hand.clock))
        // The treasury holds the refund: only the block that mines each transfer sees it empty.
        yield* fundTreasury(1_000n)
        const { requestId } = yield* seedDueRefund(1_000n)
        const status = Effect.map(
          sql<{ status: string }>`SELECT status FROM refunds WHERE request_id = ${requestId}`,
          (rows) => rows[0]!.status
        ).pipe(Effect.orDie)
        const reverted = Effect.map(
          sql<{ n: number }>`SELECT count(*)::int AS n FROM outgoing_transactions
                             WHERE kind = 'RefundBatch' AND status = 'reverted'`,
          (rows) => rows[0]!.n
        ).pipe(Effect.orDie)

        // Sent and reverted: back to due, retried after 1 s.
        yield* pass
        assert.strictEqual(counter.sends, 1)
        assert.strictEqual(yield* reverted, 1)
        assert.strictEqual(yield* status, "due")
        hand.advance(1_000)
        yield* pass
        assert.strictEqual(counter.sends, 2)
        assert.strictEqual(yield* reverted, 2)

        // The second revert doubles the wait: 1 s later nothing is sent, 2 s later the third try goes out.
        hand.advance(1_000)
        yield* pass
        assert.strictEqual(counter.sends, 2)
        hand.advance(1_000)
        yield* pass
        assert.strictEqual(counter.sends, 3)
        assert.strictEqual(yield* reverted, 3)
        hand.advance(3_999)
        yield* pass
        assert.strictEqual(counter.sends, 3)
        assert.strictEqual(yield* status, "due")
      })
    )
  })
})
