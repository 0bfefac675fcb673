import { assert, layer } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { SqlClient } from "effect/sql"
import fc from "fast-check"
import { type Hex, recoverTypedDataAddress } from "viem"
import { Chain } from "../../src/chain/Chain.ts"
import { type ReceiptBody, receiptTypedData } from "../../src/domain/Receipt.ts"
import { signReceipts } from "../../src/ledger/ReceiptSigner.ts"
import { makeReceiptStore } from "../../src/ledger/ReceiptStore.ts"
import { TestDatabase } from "../support/Database.ts"
import { arbitraryReceipt } from "../support/Receipts.ts"

const TestLayer = Layer.mergeAll(TestDatabase, Chain.layer)

/** viem's own EIP-712 signature of each receipt by the router signer, on this thread. */
const viemSignatures = (batch: ReadonlyArray<ReceiptBody>) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    return yield* Effect.forEach(batch, (receipt) =>
      Effect.orDie(chain.signTypedData(receiptTypedData(receipt, chain.chainId)))
    )
  })

/** `effect` in a scope of its own, with the means to close it. */
const scoped = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const value = yield* effect.pipe(Scope.provide(scope))
    return { value, close: Scope.close(scope, Exit.void) }
  })

layer(TestLayer, { timeout: 120_000 })("receipt signer", (it) => {
  it.effect("signs byte for byte as viem's signTypedData, and viem recovers the router signer", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      // Batches up to past two turns of the event loop (32 receipts a turn).
      for (const batch of fc.sample(fc.array(arbitraryReceipt, { minLength: 0, maxLength: 70 }), 8)) {
        const signatures = yield* Effect.orDie(signReceipts(chain, batch))
        assert.deepStrictEqual(signatures, yield* viemSignatures(batch))
        for (const [i, receipt] of batch.entries()) {
          const recovered = yield* Effect.promise(() =>
            recoverTypedDataAddress({
              ...receiptTypedData(receipt, chain.chainId),
              signature: signatures[i] as Hex
            })
          )
          assert.strictEqual(recovered, chain.routerSigner)
        }
      }
    })
  )

  it.effect("a large batch gives the event loop a turn every 32 receipts", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const batch = fc.sample(arbitraryReceipt, 100)
      let turns = 0
      let ticking = true
      const tick = () => {
        turns++
        if (ticking) setImmediate(tick)
      }
      setImmediate(tick)
      yield* Effect.yieldNow
      const before = turns
      const signatures = yield* Effect.orDie(signReceipts(chain, batch))
      ticking = false
      assert.strictEqual(signatures.length, batch.length)
      // 100 receipts: three turns given (after the 32nd, 64th and 96th).
      assert.isAtLeast(turns - before, 3)
    })
  )

  it.effect("receipts still queued when the store closes are signed before it is gone", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const chain = yield* Chain
      const batch = fc
        .sample(arbitraryReceipt, 120)
        .map((receipt, i) => ({ ...receipt, request_id: `req_shutdown_${i}`, settlement: "none" as const }))
      for (const receipt of batch) {
        yield* sql`
          INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                provider_id, authorized, charged, status)
          VALUES (${receipt.request_id}, 'openai', 'x402', ${receipt.wallet}, 'chat-small', 'chat-small',
                  'prov-a', 0, 0, 'released')
        `
        yield* sql`
          INSERT INTO receipts (request_id, epoch_id, body)
          VALUES (${receipt.request_id}, 1, ${JSON.stringify(receipt)}::jsonb)
        `
      }
      const { value: store, close } = yield* scoped(makeReceiptStore(sql, chain))
      // Queued and closed at once: no background pass has run (it waits 20 ms between passes).
      for (const receipt of batch) yield* store.enqueue(receipt)
      yield* close
      const rows = yield* sql<{ request_id: string; signature: string | null; final: boolean }>`
        SELECT request_id, signature, final FROM receipts WHERE request_id LIKE 'req_shutdown_%'
      `
      const stored = new Map(rows.map((row) => [row.request_id, row]))
      const expected = yield* viemSignatures(batch)
      for (const [i, receipt] of batch.entries()) {
        assert.strictEqual(stored.get(receipt.request_id)?.signature, expected[i])
        assert.isTrue(stored.get(receipt.request_id)?.final)
      }
    }).pipe(Effect.orDie)
  )
})
