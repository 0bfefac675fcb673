import { randomBytes } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"
import { type CaptureRecord, Ledger } from "../../src/ledger/Ledger.ts"
import { lockWaited, TestDatabase } from "../support/Database.ts"
import { seededEconomics } from "./support.ts"

/**
 * A settlement whose authorization leaves its payer's outstanding sum (a release; an `upto` capture, which
 * settles the charge itself) writes the payer's `x402_outstanding` row (the authorization's trigger) and points
 * rows (the receipt's trigger), from two CTEs of one statement. A landing takes the payer's row before any
 * points row (D513). These take it first too, by a lock-first CTE the other writes wait for, not by the order
 * Postgres happens to run the CTEs in (D519): a transaction holding the payer's row, as a landing does, makes
 * the settlement wait before it holds any points row, so the holder can still take them.
 */
const Services = Ledger.layer.pipe(Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)))

const AUTHORIZED = 10_000
const CHARGED = 7_000
/**
 * A provider of the test's own: the shard count read back is the provider's shard of this request, and two
 * tests under one provider shared a shard one time in eight (CI-like runs read 2 receipts where one was expected).
 */
const freshProvider = () => `p_locks_${randomBytes(4).toString("hex")}`

/** A request of a fresh payer reserved with an x402 authorization, and the receipt that settles it at `charged`. */
const reserve = (scheme: "exact" | "upto", provider: string) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const wallet = `0x${randomBytes(20).toString("hex")}`
    const requestId = `req_${randomBytes(8).toString("hex")}`
    yield* ledger.reserveX402(
      {
        requestId,
        dialect: "openai",
        payer: wallet,
        requestedModel: "auto",
        modelClass: "chat-small",
        providerId: provider,
        authorized: AUTHORIZED,
        agent: {}
      },
      {
        scheme,
        nonce: `0x${randomBytes(32).toString("hex")}`,
        validAfter: 0n,
        validBefore: 9_999_999_999n,
        signature: `0x${"11".repeat(65)}`
      }
    )
    const record = (charged: number): CaptureRecord => {
      const receipt: ReceiptBody = {
        request_id: requestId,
        wallet,
        provider_id: provider,
        model_class: "chat-small",
        in_tokens: 100,
        out_tokens: charged === 0 ? 0 : 20,
        cached_tokens: 0,
        price_in: 100_000,
        price_out: 400_000,
        price_in_cached: null,
        charged,
        authorized: AUTHORIZED,
        payment_ref: "",
        refund_ref: null,
        ttft_ms: 10,
        status: charged === 0 ? "released" : "ok",
        settlement: charged === 0 ? "none" : "pending",
        epoch_id: 1,
        session_id: null,
        quotes_competing: 1,
        created_at: Date.now()
      }
      return { receipt, economics: seededEconomics(requestId), source: { _tag: "X402", scheme } }
    }
    return { wallet, requestId, record }
  }).pipe(Effect.orDie)

/**
 * Runs `settle` while another transaction holds `wallet`'s `x402_outstanding` row; once the settlement waits,
 * that transaction takes the points rows the settlement's receipt moves, without waiting (NOWAIT). Returns
 * what the settlement answered.
 */
const settleWhileOutstandingHeld = (
  provider: string,
  wallet: string,
  requestId: string,
  settle: Effect.Effect<boolean>
) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // The points rows exist (a payer's and a provider's earlier receipts made them), so they can be locked.
    yield* sql`INSERT INTO points_wallets (wallet) VALUES (${wallet}) ON CONFLICT DO NOTHING`
    yield* sql`INSERT INTO points_providers (provider_id, shard) VALUES (${provider}, hashtext(${requestId}) & 7)
               ON CONFLICT DO NOTHING`
    const held = yield* Deferred.make<void>()
    const next = yield* Deferred.make<void>()
    const holder = yield* Effect.forkChild(
      sql.withTransaction(
        Effect.gen(function* () {
          yield* sql`SELECT 1 FROM x402_outstanding WHERE payer = ${wallet} FOR UPDATE`
          yield* Deferred.succeed(held, undefined)
          yield* Deferred.await(next)
          // NOWAIT: a settlement that took either before waiting for the payer's row would close a cycle here.
          yield* sql`SELECT 1 FROM points_providers WHERE provider_id = ${provider} AND shard = hashtext(${requestId}) & 7
                     FOR UPDATE NOWAIT`
          yield* sql`SELECT 1 FROM points_wallets WHERE wallet = ${wallet} FOR UPDATE NOWAIT`
        })
      )
    )
    yield* Deferred.await(held)
    const settlement = yield* Effect.forkChild(settle)
    // The settlement waits on a row lock (the holder's).
    yield* lockWaited(() => settlement.pollUnsafe() !== undefined)
    yield* Deferred.succeed(next, undefined)
    const holderExit = yield* Fiber.await(holder)
    assert.isTrue(Exit.isSuccess(holderExit), String(holderExit))
    return yield* Fiber.join(settlement)
  })

/** The payer's outstanding sum and points, and the provider shard's receipt count for the request. */
const book = (provider: string, wallet: string, requestId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [row] = yield* sql<{ outstanding: number; pending: number; receipts: number }>`
      SELECT (SELECT outstanding::int FROM x402_outstanding WHERE payer = ${wallet}) AS outstanding,
             (SELECT pending_charged::int FROM points_wallets WHERE wallet = ${wallet}) AS pending,
             (SELECT receipts::int FROM points_providers
              WHERE provider_id = ${provider} AND shard = hashtext(${requestId}) & 7) AS receipts`
    return row!
  }).pipe(Effect.orDie)

describe("a settlement that moves its payer's outstanding sum", () => {
  layer(Services, { timeout: 60_000 })((it) => {
    it.effect("an exact authorization's release takes the payer's row before its provider shard", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const provider = freshProvider()
        const { wallet, requestId, record } = yield* reserve("exact", provider)
        assert.strictEqual((yield* book(provider, wallet, requestId)).outstanding, AUTHORIZED)
        const claimed = yield* settleWhileOutstandingHeld(
          provider,
          wallet,
          requestId,
          ledger.release(record(0))
        )
        assert.isTrue(claimed)
        // Released whole: nothing outstanding, nothing earned, one receipt on the shard.
        assert.deepStrictEqual(yield* book(provider, wallet, requestId), {
          outstanding: 0,
          pending: 0,
          receipts: 1
        })
      })
    )

    it.effect("an upto capture takes the payer's row before its wallet's points row and shard", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const provider = freshProvider()
        const { wallet, requestId, record } = yield* reserve("upto", provider)
        const claimed = yield* settleWhileOutstandingHeld(
          provider,
          wallet,
          requestId,
          ledger.capture(record(CHARGED))
        )
        assert.isTrue(claimed)
        // The authorization now settles the charge itself: outstanding and pending points are the charge.
        assert.deepStrictEqual(yield* book(provider, wallet, requestId), {
          outstanding: CHARGED,
          pending: CHARGED,
          receipts: 1
        })
      })
    )
  })
})
