import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Scope } from "effect"
import { SqlClient } from "effect/sql"
import fc from "fast-check"
import { type Hex, recoverTypedDataAddress } from "viem"
import { Chain } from "../../src/chain/Chain.ts"
import { type ReceiptBody, receiptTypedData } from "../../src/domain/Receipt.ts"
import { makeReceiptSigner, type ReceiptSigner } from "../../src/ledger/ReceiptSigner.ts"
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

/** Until the signer's worker has loaded: batches before that are signed on the main thread (D424). */
const workerReady = (signer: ReceiptSigner) =>
  Effect.gen(function* () {
    // Real time: the layer's clock is the test clock.
    for (let i = 0; i < 500 && !signer.ready(); i++)
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 20)))
    assert.isTrue(signer.ready(), "the worker loaded")
  })

/** `effect` in a scope of its own, with the means to close it. */
const scoped = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const value = yield* effect.pipe(Scope.provide(scope))
    return { value, close: Scope.close(scope, Exit.void) }
  })

layer(TestLayer, { timeout: 120_000 })("receipt signer (worker thread)", (it) => {
  it.effect("signs byte for byte as viem's signTypedData, and viem recovers the router signer", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { value: signer, close } = yield* scoped(makeReceiptSigner(chain))
      // Started by the first batch (D421), which does not wait for it to load (D424).
      assert.isUndefined(signer.worker())
      const first = fc.sample(arbitraryReceipt, 3)
      assert.deepStrictEqual(yield* Effect.orDie(signer.sign(first)), yield* viemSignatures(first))
      assert.isDefined(signer.worker())
      assert.deepStrictEqual(signer.signed(), { worker: 0, thread: 3 })
      yield* workerReady(signer)
      let count = 0
      for (const batch of fc.sample(fc.array(arbitraryReceipt, { minLength: 1, maxLength: 25 }), 8)) {
        count += batch.length
        const signatures = yield* Effect.orDie(signer.sign(batch))
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
      assert.deepStrictEqual(signer.signed(), { worker: count, thread: 3 })
      yield* close
      assert.isUndefined(signer.worker())
    })
  )

  it.effect(
    "a worker with no batch for a while is let go, not counted as a crash, and the next batch starts one",
    () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { value: signer, close } = yield* scoped(makeReceiptSigner(chain, { idleStopMs: 200 }))
        const batch = fc.sample(fc.array(arbitraryReceipt, { minLength: 3, maxLength: 3 }), 1)[0]!
        const expected = yield* viemSignatures(batch)
        // More rounds than the crashes that would keep signing on the main thread for good.
        for (let round = 0; round < 4; round++) {
          // The first batch starts a worker; once it has loaded, the next is its own.
          assert.deepStrictEqual(yield* Effect.orDie(signer.sign(batch)), expected)
          yield* workerReady(signer)
          const before = signer.signed().worker
          assert.deepStrictEqual(yield* Effect.orDie(signer.sign(batch)), expected)
          assert.strictEqual(
            signer.signed().worker,
            before + batch.length,
            `round ${round}: signed by a worker`
          )
          const worker = signer.worker()
          assert.isDefined(worker, `round ${round}: a worker`)
          const exited = yield* Effect.promise(
            () => new Promise<number>((resolve) => worker!.once("exit", (code) => resolve(code)))
          ).pipe(Effect.timeout("5 seconds"), Effect.orDie)
          assert.isNumber(exited)
          assert.isUndefined(signer.worker(), `round ${round}: let go when idle`)
        }
        yield* close
      })
  )

  it.effect(
    "a worker that dies mid-batch: the batch is signed on the main thread, the next worker signs",
    () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { value: signer, close } = yield* scoped(makeReceiptSigner(chain))
        const batch = fc.sample(arbitraryReceipt, 200)
        const expected = yield* viemSignatures(batch)
        yield* Effect.orDie(signer.sign(batch.slice(0, 1)))
        yield* workerReady(signer)
        const signing = yield* Effect.forkChild(Effect.orDie(signer.sign(batch)))
        yield* Effect.yieldNow
        const first = signer.worker()
        assert.isDefined(first)
        yield* Effect.promise(() => first.terminate())
        assert.deepStrictEqual(yield* Fiber.join(signing), expected)
        assert.isUndefined(signer.worker())

        const next = fc.sample(arbitraryReceipt, 5)
        assert.deepStrictEqual(yield* Effect.orDie(signer.sign(next)), yield* viemSignatures(next))
        const second = signer.worker()
        assert.isDefined(second)
        assert.notStrictEqual(second, first)
        yield* workerReady(signer)
        const before = signer.signed().worker
        assert.deepStrictEqual(yield* Effect.orDie(signer.sign(next)), yield* viemSignatures(next))
        assert.strictEqual(signer.signed().worker, before + next.length, "the next worker signs")
        yield* close
      })
  )

  it.effect("workers that die before they answer, three in a row: signing stays on the main thread", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { value: signer, close } = yield* scoped(makeReceiptSigner(chain))
      const batch = fc.sample(arbitraryReceipt, 200)
      const expected = yield* viemSignatures(batch)
      for (let crash = 0; crash < 3; crash++) {
        yield* Effect.orDie(signer.sign(batch.slice(0, 1)))
        yield* workerReady(signer)
        const signing = yield* Effect.forkChild(Effect.orDie(signer.sign(batch)))
        yield* Effect.yieldNow
        const worker = signer.worker()
        assert.isDefined(worker, `worker ${crash} started`)
        yield* Effect.promise(() => worker.terminate())
        assert.deepStrictEqual(yield* Fiber.join(signing), expected)
      }
      assert.deepStrictEqual(yield* Effect.orDie(signer.sign(batch)), expected)
      assert.isUndefined(signer.worker())
      yield* close
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

describe("receipt signer", () => {
  it("is a module the worker thread can load without viem or effect", async () => {
    const { readFileSync } = await import("node:fs")
    for (const file of ["src/ledger/ReceiptSignerWorker.ts", "src/domain/ReceiptDigest.ts"]) {
      const imports = [...readFileSync(file, "utf8").matchAll(/^import (?!type)[^"]*"([^"]+)"/gm)].map(
        (m) => m[1]
      )
      for (const specifier of imports)
        assert.notMatch(String(specifier), /^(viem|effect)/, `${file} imports ${specifier}`)
    }
  })
})
