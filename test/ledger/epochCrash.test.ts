import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { decodeFunctionData, getAddress, type Hash, type Hex, zeroHash } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { epochAnchorAbi } from "../../src/chain/artifacts.ts"
import { Chain, ChainError, randomAuthorizationNonce } from "../../src/chain/Chain.ts"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"
import { Epochs, epochOf, PayoutConfig } from "../../src/ledger/Epochs.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { RouterConfig } from "../../src/RouterConfig.ts"
import { lockWaited, TestDatabase } from "../support/Database.ts"
import { fundTreasury, seededEconomics } from "./support.ts"

const EPOCH_SECONDS = 2
const WALLET = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"

/** The ledger over a real database and chain, no background close: each test drives `Epochs` itself. */
const TestLayer = Layer.mergeAll(Ledger.layer, Treasury.layer, PayoutConfig.layerTest(5_000)).pipe(
  Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)),
  Layer.provideMerge(RouterConfig.layerTest({ epochSeconds: EPOCH_SECONDS }))
)

// Every scenario uses its own epoch, long ended.
const baseEpoch = epochOf(Date.now(), EPOCH_SECONDS) - 200

const receiptBody = (requestId: string, epochId: number): ReceiptBody => ({
  request_id: requestId,
  wallet: WALLET,
  provider_id: "prov-a",
  model_class: "chat-medium",
  in_tokens: 1000,
  out_tokens: 200,
  cached_tokens: 0,
  price_in: 800000,
  price_out: 3200000,
  price_in_cached: null,
  charged: 1440,
  authorized: 1440,
  payment_ref: "",
  refund_ref: null,
  ttft_ms: 120,
  status: "ok",
  settlement: "pending",
  epoch_id: epochId,
  session_id: null,
  quotes_competing: 2,
  created_at: epochId * EPOCH_SECONDS * 1000 + 500
})

/** One x402 request reserved for `authorized` by `payer`. */
const reserve = (requestId: string, payer: string, authorized: number) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    return yield* ledger.reserveX402(
      {
        requestId,
        dialect: "openai",
        payer,
        requestedModel: "chat-medium",
        modelClass: "chat-medium",
        providerId: "prov-a",
        authorized,
        agent: {}
      },
      {
        nonce: randomAuthorizationNonce(),
        validAfter: 0n,
        validBefore: 2n ** 40n,
        signature: `0x${"11".repeat(65)}`
      }
    )
  })

/** Receipts of one epoch: `landed` ones captured and settled, `released` ones never charged. */
/**
 * A released receipt is signed by the ledger's background pass (every 20 ms, off the reply's path) and an
 * epoch closes only once all its receipts are signed: wait for that pass in real time, as the router's own
 * close loop does, before asking for a close that must happen.
 */
const awaitSigned = (epochId: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    for (let attempt = 0; attempt < 250; attempt++) {
      const [row] = yield* sql<{ readonly unsigned: number }>`
        SELECT count(*)::int AS unsigned FROM receipts WHERE epoch_id = ${epochId} AND signature IS NULL`
      if (row?.unsigned === 0) return
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 20)))
    }
    return yield* Effect.die(new Error(`receipts of epoch ${epochId} still unsigned after 5 s`))
  }).pipe(Effect.orDie)

const seed = (epochId: number, landed: number, released: number) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const ids: Array<string> = []
    for (let i = 0; i < landed + released; i++) {
      const requestId = `req_e${epochId}_${String(i).padStart(2, "0")}`
      ids.push(requestId)
      yield* reserve(requestId, WALLET, 1440)
      const body = receiptBody(requestId, epochId)
      if (i < landed) {
        yield* ledger.capture({ receipt: body, economics: seededEconomics(requestId) })
        yield* ledger.finalizeReceipt(requestId, {
          payment_ref: `0x${"ab".repeat(32)}`,
          settlement: "landed"
        })
      } else {
        yield* ledger.release({
          receipt: { ...body, charged: 0, out_tokens: 0, status: "released", settlement: "none" },
          economics: seededEconomics(requestId)
        })
      }
    }
    yield* awaitSigned(epochId)
    return ids
  }).pipe(Effect.orDie)

/** An `Epochs` whose treasury is the real one with some operations replaced. */
const epochsWith = (patch: (treasury: Treasury["Service"]) => Partial<Treasury["Service"]>) =>
  Effect.gen(function* () {
    const treasury = yield* Treasury
    return yield* Epochs.make.pipe(Effect.provideService(Treasury, { ...treasury, ...patch(treasury) }))
  })

const epochRow = (epochId: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{
      status: string
      root: string | null
      anchor_tx: string | null
      receipts: number
    }>`
      SELECT status, root, anchor_tx, receipts FROM epochs WHERE epoch_id = ${epochId}
    `
    return rows[0]
  }).pipe(Effect.orDie)

/** Every anchor transaction ever sent, by epoch id (reverted duplicates included). */
const anchorTransactions = Effect.gen(function* () {
  const chain = yield* Chain
  const latest = yield* chain.blockNumber()
  const byEpoch = new Map<number, Array<Hash>>()
  for (let n = 0n; n <= latest; n++) {
    const block = yield* Effect.promise(() =>
      chain.publicClient.getBlock({ blockNumber: n, includeTransactions: true })
    )
    for (const tx of block.transactions) {
      if (tx.to?.toLowerCase() !== chain.anchor.toLowerCase()) continue
      const { args } = decodeFunctionData({ abi: epochAnchorAbi, data: tx.input })
      const epoch = Number(args![0] as bigint)
      byEpoch.set(epoch, [...(byEpoch.get(epoch) ?? []), tx.hash])
    }
  }
  return byEpoch
}).pipe(Effect.orDie)

/** A closed epoch: recorded root = anchored root, one anchor transaction, the recorded one. */
const assertClosedOnce = (epochId: number, ids: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const epochs = yield* Epochs
    const row = (yield* epochRow(epochId))!
    assert.strictEqual(row.status, "closed")
    assert.strictEqual(row.receipts, ids.length)
    assert.strictEqual(yield* chain.anchoredRoot(BigInt(epochId)), row.root)
    const sent = (yield* anchorTransactions).get(epochId) ?? []
    assert.deepStrictEqual(sent, [row.anchor_tx])
    for (const id of ids) {
      const inclusion = (yield* epochs.inclusion(id))!
      assert.strictEqual(inclusion.root, row.root)
      assert.strictEqual(inclusion.anchor_tx, row.anchor_tx)
    }
    return row
  }).pipe(Effect.orDie)

/** Runs one close in a fiber until `reached` fires, then kills it as a crash would. */
const crashAt = (epochs: Epochs["Service"], reached: Deferred.Deferred<void>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(epochs.closeEnded)
    yield* Deferred.await(reached)
    yield* Fiber.interrupt(fiber)
  })

describe("epoch close: crashes and restarts complete it exactly once", () => {
  layer(Layer.effect(Epochs, Epochs.make).pipe(Layer.provideMerge(TestLayer)), {
    excludeTestServices: true,
    timeout: 120_000
  })((it) => {
    it.effect("chain down at the anchor: the close stays `closing`, the next pass anchors it", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const epochId = baseEpoch
        const ids = yield* seed(epochId, 2, 1)
        const down = yield* epochsWith((real) => ({
          send: (transfer) =>
            transfer._tag === "EpochAnchor"
              ? Effect.fail(new ChainError({ reason: "Rpc", message: "chain down" }))
              : real.send(transfer)
        }))
        const report = yield* down.closeEnded
        assert.deepStrictEqual(report.closed, [])
        const closing = (yield* epochRow(epochId))!
        assert.strictEqual(closing.status, "closing")
        assert.match(closing.root!, /^0x[0-9a-f]{64}$/)
        assert.isNull(closing.anchor_tx)
        assert.strictEqual(yield* chain.anchoredRoot(BigInt(epochId)), zeroHash)
        // Nothing to prove before the anchor.
        assert.isUndefined(yield* (yield* Epochs).inclusion(ids[0]!))

        const healthy = yield* Epochs.make
        assert.deepStrictEqual((yield* healthy.closeEnded).closed, [epochId])
        const closed = yield* assertClosedOnce(epochId, ids)
        assert.strictEqual(closed.root, closing.root)
        // A later pass has nothing left to do.
        assert.deepStrictEqual((yield* healthy.closeEnded).closed, [])
      })
    )

    it.effect("killed after `closing` is recorded, before the anchor is sent", () =>
      Effect.gen(function* () {
        const epochId = baseEpoch + 5
        const ids = yield* seed(epochId, 1, 1)
        const reached = yield* Deferred.make<void>()
        const crashing = yield* epochsWith((real) => ({
          send: (transfer) =>
            transfer._tag === "EpochAnchor"
              ? Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
              : real.send(transfer)
        }))
        yield* crashAt(crashing, reached)
        const closing = (yield* epochRow(epochId))!
        assert.strictEqual(closing.status, "closing")
        assert.isNull(closing.anchor_tx)

        // The advisory lock died with the crashed close: a fresh instance takes over.
        const fresh = yield* Epochs.make
        assert.deepStrictEqual((yield* fresh.closeEnded).closed, [epochId])
        const closed = yield* assertClosedOnce(epochId, ids)
        assert.strictEqual(closed.root, closing.root)
      })
    )

    it.effect(
      "killed after the anchor is broadcast, before its hash is recorded: the anchor is adopted",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const epochId = baseEpoch + 10
          const ids = yield* seed(epochId, 3, 0)
          const reached = yield* Deferred.make<void>()
          let broadcast: Hex | undefined
          const crashing = yield* epochsWith((real) => ({
            send: (transfer) =>
              transfer._tag !== "EpochAnchor"
                ? real.send(transfer)
                : Effect.gen(function* () {
                    broadcast = yield* real.send(transfer)
                    yield* Deferred.succeed(reached, undefined)
                    return yield* Effect.never
                  })
          }))
          yield* crashAt(crashing, reached)
          const closing = (yield* epochRow(epochId))!
          assert.strictEqual(closing.status, "closing")
          assert.isNull(closing.anchor_tx)
          yield* chain.waitForReceipt(broadcast!)
          assert.strictEqual(yield* chain.anchoredRoot(BigInt(epochId)), closing.root)

          const fresh = yield* Epochs.make
          assert.deepStrictEqual((yield* fresh.closeEnded).closed, [epochId])
          const closed = yield* assertClosedOnce(epochId, ids)
          assert.strictEqual(closed.anchor_tx, broadcast)
        })
    )

    it.effect(
      "killed after the anchor hash is recorded, before it is confirmed: the same tx is awaited",
      () =>
        Effect.gen(function* () {
          const epochId = baseEpoch + 15
          const ids = yield* seed(epochId, 1, 0)
          const reached = yield* Deferred.make<void>()
          const crashing = yield* epochsWith(() => ({
            confirm: () => Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
          }))
          yield* crashAt(crashing, reached)
          const recorded = (yield* epochRow(epochId))!
          assert.strictEqual(recorded.status, "closing")
          assert.match(recorded.anchor_tx!, /^0x[0-9a-f]{64}$/)

          const fresh = yield* Epochs.make
          assert.deepStrictEqual((yield* fresh.closeEnded).closed, [epochId])
          const closed = yield* assertClosedOnce(epochId, ids)
          assert.strictEqual(closed.anchor_tx, recorded.anchor_tx)
        })
    )

    it.effect(
      "two instances closing at once: one anchors, the other waits its turn and finds nothing to do",
      () =>
        Effect.gen(function* () {
          const epochId = baseEpoch + 20
          const ids = yield* seed(epochId, 2, 2)
          const [a, b] = [yield* Epochs.make, yield* Epochs.make]
          const reports = yield* Effect.all([a.closeEnded, b.closeEnded, a.closeEnded], {
            concurrency: "unbounded"
          })
          assert.deepStrictEqual(
            reports.flatMap((r) => r.closed),
            [epochId]
          )
          yield* assertClosedOnce(epochId, ids)
        })
    )

    it.effect(
      "an epoch waits for its last settlement and for requests still in flight; empty epochs are skipped",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const ledger = yield* Ledger
          const epochs = yield* Epochs.make
          const epochId = baseEpoch + 25
          const ids = yield* seed(epochId, 1, 0)
          // A captured request of the epoch whose payment has not landed yet.
          const pendingId = `req_e${epochId}_pending`
          yield* ledger.reserveX402(
            {
              requestId: pendingId,
              dialect: "openai",
              payer: WALLET,
              requestedModel: "chat-medium",
              modelClass: "chat-medium",
              providerId: "prov-a",
              authorized: 1440,
              agent: {}
            },
            {
              nonce: randomAuthorizationNonce(),
              validAfter: 0n,
              validBefore: 2n ** 40n,
              signature: `0x${"11".repeat(65)}`
            }
          )
          yield* ledger.capture({
            receipt: receiptBody(pendingId, epochId),
            economics: seededEconomics(pendingId)
          })
          // A request reserved during the epoch and still being served.
          const inFlightId = `req_e${epochId}_inflight`
          yield* ledger.reserveX402(
            {
              requestId: inFlightId,
              dialect: "openai",
              payer: WALLET,
              requestedModel: "chat-medium",
              modelClass: "chat-medium",
              providerId: "prov-a",
              authorized: 1440,
              agent: {}
            },
            {
              nonce: randomAuthorizationNonce(),
              validAfter: 0n,
              validBefore: 2n ** 40n,
              signature: `0x${"11".repeat(65)}`
            }
          )
          const epochStart = epochId * EPOCH_SECONDS
          yield* sql`UPDATE requests SET created_at = to_timestamp(${epochStart + 1})
                     WHERE request_id = ${inFlightId}`

          assert.deepStrictEqual((yield* epochs.closeEnded).closed, [])
          yield* ledger.finalizeReceipt(pendingId, {
            payment_ref: `0x${"cd".repeat(32)}`,
            settlement: "landed"
          })
          assert.deepStrictEqual((yield* epochs.closeEnded).closed, [])
          assert.isUndefined(yield* epochRow(epochId))

          yield* ledger.release({
            receipt: {
              ...receiptBody(inFlightId, epochId),
              charged: 0,
              status: "released",
              settlement: "none"
            },
            economics: seededEconomics(inFlightId)
          })
          yield* awaitSigned(epochId)
          assert.deepStrictEqual((yield* epochs.closeEnded).closed, [epochId])
          yield* assertClosedOnce(epochId, [...ids, pendingId, inFlightId])

          // Epochs in between had no receipts: no row, nothing anchored.
          const chain = yield* Chain
          assert.isUndefined(yield* epochRow(epochId - 1))
          assert.strictEqual(yield* chain.anchoredRoot(BigInt(epochId - 1)), zeroHash)
        })
    )

    it.effect(
      "a refund batch whose broadcast reply times out is paid once: confirmed, never sent back to due and paid again",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const sql = yield* SqlClient.SqlClient
          const ledger = yield* Ledger
          const epochId = baseEpoch + 40
          const payer = privateKeyToAccount(generatePrivateKey()).address.toLowerCase()
          yield* fundTreasury(1_000_000n)
          // Two captured x402 requests of `payer`, each authorized 20,000 and charged 1,440: 37,120 due.
          for (const i of [0, 1]) {
            const requestId = `req_refund_${epochId}_${i}`
            yield* reserve(requestId, payer, 20_000)
            yield* ledger.capture({
              receipt: { ...receiptBody(requestId, epochId), wallet: payer, authorized: 20_000 },
              economics: seededEconomics(requestId)
            })
            yield* ledger.finalizeReceipt(requestId, {
              payment_ref: `0x${"ab".repeat(32)}`,
              settlement: "landed"
            })
            yield* sql`UPDATE x402_authorizations SET status = 'landed' WHERE request_id = ${requestId}`
          }
          // The node takes the refund transfer, but the reply to the broadcast never comes (a timeout).
          const real = yield* Chain
          const timingOut = {
            ...real,
            outgoing: {
              ...real.outgoing,
              broadcast: (raw: Hex) =>
                Effect.andThen(
                  real.outgoing.broadcast(raw),
                  Effect.fail(new ChainError({ reason: "Timeout", message: "no reply to the broadcast" }))
                )
            }
          }
          const treasury = yield* Treasury.make().pipe(Effect.provideService(Chain, timingOut))
          const epochs = yield* Epochs.make.pipe(Effect.provideService(Treasury, treasury))
          yield* epochs.closeEnded
          yield* epochs.closeEnded
          const healthy = yield* Epochs.make
          yield* healthy.closeEnded
          const rows = yield* sql<{ status: string; tx_hash: string | null }>`
            SELECT status, tx_hash FROM refunds WHERE payer = ${payer}`
          assert.lengthOf(rows, 2)
          assert.isTrue(rows.every((r) => r.status === "paid" && r.tx_hash === rows[0]!.tx_hash))
          assert.strictEqual(yield* chain.balanceOf(getAddress(payer)), 2n * (20_000n - 1_440n))
          const transfers = yield* chain.readTransferLogs({
            fromBlock: 0n,
            toBlock: yield* chain.blockNumber(),
            to: getAddress(payer)
          })
          assert.deepStrictEqual(
            transfers.map((t) => t.txHash),
            [rows[0]!.tx_hash]
          )
        })
    )
    it.effect(
      "the close locks its epoch's receipts in request_id order, the order a landing locks them in (D521)",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const ledger = yield* Ledger
          const epochs = yield* Epochs
          const epochId = baseEpoch + 90
          // The later id is written first: in the table's (and the epoch index's) order it comes first.
          const ids = [`req_e${epochId}_lock_b`, `req_e${epochId}_lock_a`]
          for (const requestId of ids) {
            yield* reserve(requestId, WALLET, 1440)
            yield* ledger.capture({
              receipt: receiptBody(requestId, epochId),
              economics: seededEconomics(requestId)
            })
            yield* ledger.finalizeReceipt(requestId, {
              payment_ref: `0x${"ab".repeat(32)}`,
              settlement: "landed"
            })
          }
          yield* awaitSigned(epochId)
          // A landing holds the later receipt, as one settling it would.
          const holding = yield* Deferred.make<void>()
          const letGo = yield* Deferred.make<void>()
          const holder = yield* Effect.forkChild(
            sql.withTransaction(
              Effect.gen(function* () {
                yield* sql`SELECT 1 FROM receipts WHERE request_id = ${ids[0]!} FOR UPDATE`
                yield* Deferred.succeed(holding, undefined)
                yield* Deferred.await(letGo)
              })
            )
          )
          yield* Deferred.await(holding)
          let closed = false
          const close = yield* Effect.forkChild(
            Effect.ensuring(
              epochs.closeEnded,
              Effect.sync(() => {
                closed = true
              })
            )
          )
          yield* lockWaited(() => closed)
          assert.isFalse(closed, "the close waits for the held receipt")
          // In request_id order the close took the earlier receipt before it waited: nobody else can have it,
          // so a landing that holds the later one and wants the earlier cannot close a cycle with it.
          const earlier =
            yield* sql`SELECT 1 FROM receipts WHERE request_id = ${ids[1]!} FOR UPDATE NOWAIT`.pipe(
              Effect.exit
            )
          assert.isTrue(Exit.isFailure(earlier), "the close holds the earlier receipt while it waits")
          yield* Deferred.succeed(letGo, undefined)
          yield* Fiber.join(holder)
          yield* Fiber.join(close)
          yield* assertClosedOnce(epochId, ids)
        }).pipe(Effect.orDie)
    )
  })
})
