import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { type Address, type Hash, isAddressEqual } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { Chain, randomAuthorizationNonce } from "../../src/chain/Chain.ts"
import { feeSplit } from "../../src/domain/Billing.ts"
import type { ReceiptBody } from "../../src/domain/Receipt.ts"
import { Epochs, epochOf, PayoutConfig } from "../../src/ledger/Epochs.ts"
import { Ledger, type PaymentSource } from "../../src/ledger/Ledger.ts"
import { makeProviderPayouts } from "../../src/ledger/Payouts.ts"
import { type Discrepancy, Reconciliation } from "../../src/ledger/Reconciliation.ts"
import type { OutgoingTransfer } from "../../src/ledger/Transfers.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { RouterConfig } from "../../src/RouterConfig.ts"
import { TestDatabase } from "../support/Database.ts"
import { routerWithFleet } from "../support/Router.ts"
import {
  fundTreasury,
  paidCompletion,
  receiptWhere,
  seededEconomics,
  waitFor,
  waitForBook
} from "./support.ts"

interface PayoutRow {
  readonly payout_id: string
  readonly provider_id: string
  readonly to_address: string
  readonly amount: string
  readonly status: string
  readonly tx_hash: string | null
}

const payoutsOf = (providerId: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<PayoutRow>`
      SELECT payout_id, provider_id, to_address, amount::text AS amount, status, tx_hash
      FROM provider_payouts WHERE provider_id = ${providerId} ORDER BY created_at`
  ).pipe(Effect.orDie)

/** Every token transfer ever received by `to`. */
const transfersTo = (to: Address) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    return yield* chain.readTransferLogs({ fromBlock: 0n, toBlock: yield* chain.blockNumber(), to })
  }).pipe(Effect.orDie)

const kinds = (discrepancies: ReadonlyArray<Discrepancy>) => discrepancies.map((d) => d.kind)

describe("provider payouts through the router: paid requests, close, the signers paid on chain", () => {
  const floorOne = ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ PAYOUT_FLOOR: "1" }), {
    asPrimary: true
  })
  layer(routerWithFleet({ epochSeconds: 2 }).pipe(Layer.provide(floorOne)), {
    excludeTestServices: true,
    timeout: 240_000
  })((it) => {
    it.effect(
      "each provider's signer receives exactly the sum of its shares; reconciliation agrees and finds a corrupted payout",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const chain = yield* Chain
          const reconciliation = yield* Reconciliation
          yield* waitForBook
          const providers = yield* sql<{ provider_id: string; signer: Address }>`
            SELECT provider_id, signer FROM providers ORDER BY provider_id`
          const before = new Map<string, bigint>()
          for (const p of providers) before.set(p.provider_id, yield* chain.balanceOf(p.signer))

          const ids = yield* Effect.all(
            [0, 1, 0, 1, 0, 1].map((wallet, i) => paidCompletion(wallet, `Pay my provider ${i}.`)),
            { concurrency: "unbounded" }
          )
          for (const id of ids) yield* receiptWhere(id, (r) => r.inclusion !== null, 60_000)
          yield* waitFor(
            "every share paid out",
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM requests q JOIN provider_payouts p ON p.payout_id = q.payout_id
                WHERE q.request_id IN ${sql.in(ids)} AND p.status = 'paid'`.pipe(Effect.orDie),
              (rows) => (rows[0]!.n === ids.length ? true : undefined)
            ),
            60_000
          )

          const shares = yield* sql<{ provider_id: string; share: string }>`
            SELECT q.provider_id, sum(l.amount)::text AS share FROM requests q
            JOIN ledger_entries l ON l.request_id = q.request_id AND l.kind = 'provider_share'
            WHERE q.request_id IN ${sql.in(ids)} GROUP BY q.provider_id`
          assert.isAbove(shares.length, 0)
          for (const { provider_id, share } of shares) {
            const signer = providers.find((p) => p.provider_id === provider_id)!.signer
            const received = (yield* chain.balanceOf(signer)) - before.get(provider_id)!
            assert.strictEqual(received, BigInt(share), `${provider_id} receives exactly its shares`)
            const payouts = yield* payoutsOf(provider_id)
            assert.isTrue(
              payouts.every((p) => p.status === "paid" && isAddressEqual(p.to_address as Address, signer))
            )
            assert.strictEqual(
              payouts.reduce((a, p) => a + BigInt(p.amount), 0n),
              BigInt(share)
            )
            for (const payout of payouts) {
              const [booked] = yield* sql<{ amount: string }>`
                SELECT amount::text AS amount FROM ledger_entries
                WHERE kind = 'provider_paid' AND account = ${`provider:${provider_id}`} AND ref = ${payout.tx_hash}`
              assert.strictEqual(booked!.amount, payout.amount)
            }
          }
          // Providers that served nothing were sent nothing.
          for (const p of providers.filter((p) => !shares.some((s) => s.provider_id === p.provider_id))) {
            assert.strictEqual(yield* chain.balanceOf(p.signer), before.get(p.provider_id))
          }

          const clean = yield* reconciliation.runOnce
          assert.strictEqual(clean.status, "ok", JSON.stringify(clean.discrepancies))

          // A payout recorded for more than the transfer that paid it.
          const [payout] = yield* sql<PayoutRow>`
            SELECT payout_id, provider_id, to_address, amount::text AS amount, status, tx_hash
            FROM provider_payouts WHERE status = 'paid' ORDER BY payout_id LIMIT 1`
          yield* sql`UPDATE provider_payouts SET amount = amount + 3 WHERE payout_id = ${payout!.payout_id}`
          const corrupted = yield* reconciliation.runOnce
          assert.strictEqual(corrupted.status, "failed")
          const transfer = corrupted.discrepancies.find((d) => d.kind === "payout_transfer_mismatch")!
          assert.strictEqual(transfer.payout_id, payout!.payout_id)
          assert.strictEqual(transfer.tx, payout!.tx_hash)
          assert.strictEqual(transfer.expected, String(BigInt(payout!.amount) + 3n))
          assert.strictEqual(transfer.actual, payout!.amount)
          assert.isTrue(
            corrupted.discrepancies
              .filter((d) => d.kind === "payout_ledger_mismatch")
              .every((d) => d.payout_id === payout!.payout_id)
          )
          assert.notInclude(kinds(corrupted.discrepancies), "treasury_mismatch")
          yield* sql`UPDATE provider_payouts SET amount = amount - 3 WHERE payout_id = ${payout!.payout_id}`

          // A provider_paid row edited: the payout's booking and the treasury's movement disagree.
          yield* sql`UPDATE ledger_entries SET amount = amount + 5 WHERE kind = 'provider_paid' AND ref = ${payout!.tx_hash}`
          const booked = yield* reconciliation.runOnce
          assert.includeMembers(kinds(booked.discrepancies), ["payout_ledger_mismatch", "treasury_mismatch"])
          assert.strictEqual(
            booked.discrepancies.find((d) => d.kind === "payout_ledger_mismatch")!.payout_id,
            payout!.payout_id
          )
          yield* sql`UPDATE ledger_entries SET amount = amount - 5 WHERE kind = 'provider_paid' AND ref = ${payout!.tx_hash}`

          const repaired = yield* reconciliation.runOnce
          assert.strictEqual(repaired.status, "ok", JSON.stringify(repaired.discrepancies))
        }),
      { timeout: 180_000 }
    )
  })
})

// ---- the close driven by hand over a seeded ledger, a real database and a real chain ----

const EPOCH_SECONDS = 2
const FLOOR = 5_000
const CHARGE = 2_000
const SHARE = BigInt(feeSplit(CHARGE).providerShare)

const TestLayer = Layer.mergeAll(Ledger.layer, Treasury.layer, PayoutConfig.layerTest(FLOOR)).pipe(
  Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)),
  Layer.provideMerge(RouterConfig.layerTest({ epochSeconds: EPOCH_SECONDS }))
)

const baseEpoch = epochOf(Date.now(), EPOCH_SECONDS) - 500

/** A provider registered with a fresh signer, whose balance starts at zero. */
const registerProvider = (providerId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const signer = privateKeyToAccount(generatePrivateKey()).address
    yield* sql`INSERT INTO providers (provider_id, signer, base_url, dialect)
               VALUES (${providerId}, ${signer}, 'http://127.0.0.1:1', 'openai')`
    return signer
  }).pipe(Effect.orDie)

let seq = 0

/**
 * One captured request of `providerId` in `epochId`, paid by x402 (landed or not), by a funded key, or
 * drawn as a turn on a budget session.
 */
const seedRequest = (
  providerId: string,
  epochId: number,
  payment: "landed" | "pending" | "credit" | { readonly turnOf: string },
  charge = CHARGE
) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const ledger = yield* Ledger
    const chain = yield* Chain
    const payer = chain.demoWallets[6]!.address.toLowerCase()
    const requestId = `req_${providerId}_${String(seq++).padStart(3, "0")}`
    const sessionId = typeof payment === "object" ? payment.turnOf : undefined
    const record = {
      requestId,
      sessionId,
      dialect: "openai",
      payer,
      requestedModel: "chat-medium",
      modelClass: "chat-medium",
      providerId,
      authorized: charge,
      agent: {}
    }
    const receipt: ReceiptBody = {
      request_id: requestId,
      wallet: payer,
      provider_id: providerId,
      model_class: "chat-medium",
      in_tokens: 1000,
      out_tokens: 200,
      cached_tokens: 0,
      price_in: 800000,
      price_out: 3200000,
      price_in_cached: null,
      charged: charge,
      authorized: charge,
      payment_ref: "",
      refund_ref: null,
      ttft_ms: 120,
      status: "ok",
      settlement: payment === "credit" || sessionId !== undefined ? "landed" : "pending",
      epoch_id: epochId,
      session_id: sessionId ?? null,
      quotes_competing: 2,
      created_at: epochId * EPOCH_SECONDS * 1000 + 500
    }
    let source: PaymentSource = { _tag: "X402" }
    if (payment === "credit") {
      const keyId = `key_${requestId}`
      yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${payer}, ${charge})
                 ON CONFLICT (wallet) DO UPDATE SET available = wallet_balances.available + EXCLUDED.available`
      yield* sql`INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget)
                 VALUES (${keyId}, ${payer}, 'test', 'credit', ${keyId}, ${charge})`
      yield* ledger.reserveCredit(record, keyId)
      source = { _tag: "Credit", keyId }
    } else if (sessionId !== undefined) {
      yield* ledger.reserveSessionTurn(record)
      yield* sql`UPDATE sessions SET in_flight = ${requestId} WHERE session_id = ${sessionId}`
      source = { _tag: "SessionTurn", sessionId, prefixTokens: 0 }
    } else {
      yield* ledger.reserveX402(record, {
        nonce: randomAuthorizationNonce(),
        validAfter: 0n,
        validBefore: 2n ** 40n,
        signature: `0x${"11".repeat(65)}`
      })
    }
    yield* ledger.capture({ receipt, economics: seededEconomics(requestId), source })
    if (payment === "landed") yield* landed(requestId)
    return requestId
  }).pipe(Effect.orDie)

const landed = (requestId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const ledger = yield* Ledger
    const tx = `0x${"ab".repeat(32)}`
    yield* sql`UPDATE x402_authorizations SET status = 'landed', tx_hash = ${tx} WHERE request_id = ${requestId}`
    yield* ledger.finalizeReceipt(requestId, { payment_ref: tx, settlement: "landed" })
  }).pipe(Effect.orDie)

const linkedTo = (requestIds: ReadonlyArray<string>) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<{ request_id: string; payout_id: string | null }>`
      SELECT request_id, payout_id FROM requests WHERE request_id IN ${sql.in(requestIds)} ORDER BY request_id`
  ).pipe(Effect.orDie)

const epochsWith = (patch: (treasury: Treasury["Service"]) => Partial<Treasury["Service"]>) =>
  Effect.gen(function* () {
    const treasury = yield* Treasury
    return yield* Epochs.make.pipe(Effect.provideService(Treasury, { ...treasury, ...patch(treasury) }))
  })

/** Whether a transfer is a provider payout to `signer`. */
const paysTo = (transfer: OutgoingTransfer, signer: Address) =>
  transfer._tag === "ProviderPayout" && isAddressEqual(transfer.to, signer)

const crashAt = (epochs: Epochs["Service"], reached: Deferred.Deferred<void>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(epochs.closeEnded)
    yield* Deferred.await(reached)
    yield* Fiber.interrupt(fiber)
  })

/** The provider was paid `amount` exactly once: one paid payout, one transfer from the treasury. */
const assertPaidOnce = (providerId: string, signer: Address, amount: bigint) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    assert.strictEqual(yield* chain.balanceOf(signer), amount)
    const transfers = yield* transfersTo(signer)
    assert.strictEqual(transfers.length, 1)
    assert.isTrue(isAddressEqual(transfers[0]!.from, chain.treasury))
    assert.strictEqual(transfers[0]!.value, amount)
    const paid = (yield* payoutsOf(providerId)).filter((p) => p.status === "paid")
    assert.strictEqual(paid.length, 1)
    assert.strictEqual(paid[0]!.amount, amount.toString())
    assert.strictEqual(paid[0]!.tx_hash, transfers[0]!.txHash)
    return paid[0]!
  })

describe("provider payouts at epoch close: the floor, and crashes that never pay twice", () => {
  layer(Layer.effect(Epochs, Epochs.make).pipe(Layer.provideMerge(TestLayer)), {
    excludeTestServices: true,
    timeout: 120_000
  })((it) => {
    it.effect(
      "below the floor nothing is sent and shares accrue; at the floor one transfer pays their sum",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const epochs = yield* Epochs
          yield* fundTreasury(1_000_000n)
          const signer = yield* registerProvider("prov-floor")
          const first = [
            yield* seedRequest("prov-floor", baseEpoch, "landed"),
            yield* seedRequest("prov-floor", baseEpoch, "landed")
          ]
          // Not payable: a payment still pending, and an epoch that has not ended.
          const pending = yield* seedRequest("prov-floor", baseEpoch, "pending")
          const current = yield* seedRequest(
            "prov-floor",
            epochOf(Date.now(), EPOCH_SECONDS) + 1_000,
            "landed"
          )
          assert.isBelow(Number(2n * SHARE), FLOOR)

          const below = yield* epochs.closeEnded
          assert.strictEqual(below.payouts, 0)
          assert.strictEqual(yield* (yield* Chain).balanceOf(signer), 0n)
          assert.deepStrictEqual(yield* payoutsOf("prov-floor"), [])
          assert.isTrue((yield* linkedTo([...first, pending, current])).every((r) => r.payout_id === null))
          const credited = yield* sql`SELECT 1 FROM wallet_balances WHERE wallet = ${signer.toLowerCase()}`
          assert.strictEqual(credited.length, 0, "an accrued share is never credited to a balance")

          // A key-paid request (final on capture) in a later ended epoch takes the total over the floor.
          const credit = yield* seedRequest("prov-floor", baseEpoch + 1, "credit")
          const paid = yield* epochs.closeEnded
          assert.strictEqual(paid.payouts, 1)
          const payout = yield* assertPaidOnce("prov-floor", signer, 3n * SHARE)
          assert.isTrue(isAddressEqual(payout.to_address as Address, signer))
          const links = yield* linkedTo([...first, credit, pending, current])
          assert.deepStrictEqual(
            links.filter((r) => r.payout_id !== null).map((r) => r.request_id),
            [...first, credit].sort()
          )
          assert.isTrue(
            links.filter((r) => r.payout_id !== null).every((r) => r.payout_id === payout.payout_id)
          )
          const ledgerRows = yield* sql<{ account: string; amount: string; ref: string }>`
          SELECT account, amount::text AS amount, ref FROM ledger_entries WHERE kind = 'provider_paid'
          AND account = 'provider:prov-floor'`
          assert.deepStrictEqual(ledgerRows, [
            { account: "provider:prov-floor", amount: (3n * SHARE).toString(), ref: payout.tx_hash! }
          ])

          // The pending payment lands: one share, below the floor again, accrues; nothing is paid twice.
          yield* landed(pending)
          assert.strictEqual((yield* epochs.closeEnded).payouts, 0)
          assert.strictEqual((yield* epochs.closeEnded).payouts, 0)
          yield* assertPaidOnce("prov-floor", signer, 3n * SHARE)
          assert.isNull((yield* linkedTo([pending]))[0]!.payout_id)
        })
    )

    it.effect(
      "killed after the payout is broadcast and its hash recorded: the same transfer is confirmed",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          yield* fundTreasury(1_000_000n)
          const signer = yield* registerProvider("prov-hash")
          const ids = yield* Effect.forEach([0, 1, 2], () =>
            seedRequest("prov-hash", baseEpoch + 10, "landed")
          )
          const reached = yield* Deferred.make<void>()
          let sent: Hash | undefined
          const crashing = yield* epochsWith((real) => ({
            send: (transfer) =>
              Effect.tap(real.send(transfer), (hash) =>
                Effect.sync(() => {
                  if (paysTo(transfer, signer)) sent = hash
                })
              ),
            confirm: (hash) =>
              hash === sent
                ? Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
                : real.confirm(hash)
          }))
          yield* crashAt(crashing, reached)
          const [paying] = yield* payoutsOf("prov-hash")
          assert.strictEqual(paying!.status, "paying")
          assert.strictEqual(paying!.tx_hash, sent)
          assert.isTrue((yield* linkedTo(ids)).every((r) => r.payout_id === paying!.payout_id))

          const fresh = yield* Epochs.make
          assert.strictEqual((yield* fresh.closeEnded).payouts, 1)
          const payout = yield* assertPaidOnce("prov-hash", signer, 3n * SHARE)
          assert.strictEqual(payout.payout_id, paying!.payout_id)
          assert.strictEqual(payout.tx_hash, sent)
          assert.strictEqual((yield* fresh.closeEnded).payouts, 0)
          const [count] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM ledger_entries WHERE kind = 'provider_paid' AND account = 'provider:prov-hash'`
          assert.strictEqual(count!.n, 1)
        })
    )

    it.effect(
      "killed between the broadcast and recording its hash: the transfer recorded by the treasury is adopted",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          const signer = yield* registerProvider("prov-lost")
          yield* Effect.forEach([0, 1, 2], () => seedRequest("prov-lost", baseEpoch + 20, "landed"))
          const reached = yield* Deferred.make<void>()
          let sent: Hash | undefined
          const crashing = yield* epochsWith((real) => ({
            send: (transfer) =>
              paysTo(transfer, signer)
                ? Effect.gen(function* () {
                    sent = yield* real.send(transfer)
                    yield* real.confirm(sent)
                    yield* Deferred.succeed(reached, undefined)
                    return yield* Effect.never
                  })
                : real.send(transfer)
          }))
          yield* crashAt(crashing, reached)
          const [paying] = yield* payoutsOf("prov-lost")
          assert.strictEqual(paying!.status, "paying")
          assert.isNull(paying!.tx_hash)

          const fresh = yield* Epochs.make
          assert.strictEqual((yield* fresh.closeEnded).payouts, 1)
          const payout = yield* assertPaidOnce("prov-lost", signer, 3n * SHARE)
          assert.strictEqual(payout.payout_id, paying!.payout_id)
          assert.strictEqual(payout.tx_hash, sent)
        })
    )

    it.effect(
      "killed after the claim, before any transaction is recorded: the resumed close pays that payout once",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          const signer = yield* registerProvider("prov-unsent")
          const ids = yield* Effect.forEach([0, 1, 2], () =>
            seedRequest("prov-unsent", baseEpoch + 30, "landed")
          )
          const reached = yield* Deferred.make<void>()
          const crashing = yield* epochsWith((real) => ({
            send: (transfer) =>
              paysTo(transfer, signer)
                ? Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
                : real.send(transfer)
          }))
          yield* crashAt(crashing, reached)
          const [claimed] = yield* payoutsOf("prov-unsent")
          assert.strictEqual(claimed!.status, "paying")
          assert.strictEqual(yield* (yield* Chain).balanceOf(signer), 0n)

          // Nothing was recorded for the payout, so nothing can be on its way: the next close sends it,
          // once, under the same claim (no 10-minute wait for a broadcast that cannot exist).
          const fresh = yield* Epochs.make
          assert.strictEqual((yield* fresh.closeEnded).payouts, 1)
          const payout = yield* assertPaidOnce("prov-unsent", signer, 3n * SHARE)
          assert.strictEqual(payout.payout_id, claimed!.payout_id)
          assert.isTrue((yield* linkedTo(ids)).every((r) => r.payout_id === payout.payout_id))
          assert.strictEqual((yield* fresh.closeEnded).payouts, 0)
        })
    )

    it.effect(
      "a payout the treasury cannot cover is not claimed, the next passes wait for its balance to rise, then it is paid",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const epochs = yield* Epochs
          const signer = yield* registerProvider("prov-large")
          const charge = 2_000_000_000
          const share = BigInt(feeSplit(charge).providerShare)
          const large = yield* seedRequest("prov-large", baseEpoch + 40, "landed", charge)
          assert.isTrue((yield* chain.balanceOf(chain.treasury)) < share)

          // Refused before its claim (D568): no payout row, its share still unclaimed, nothing sent.
          assert.strictEqual((yield* epochs.closeEnded).payouts, 0)
          assert.deepStrictEqual(yield* payoutsOf("prov-large"), [])
          assert.isTrue((yield* linkedTo([large])).every((r) => r.payout_id === null))
          assert.strictEqual(yield* chain.balanceOf(signer), 0n)

          // With the balance where it was, the next pass does not look at the shares again (a provider the treasury
          // could pay waits with it); a rise of the balance pays both at once.
          const smallSigner = yield* registerProvider("prov-small")
          const smallCharge = 6_000
          const smallShare = BigInt(feeSplit(smallCharge).providerShare)
          yield* seedRequest("prov-small", baseEpoch + 40, "landed", smallCharge)
          assert.strictEqual((yield* epochs.closeEnded).payouts, 0)
          assert.deepStrictEqual(yield* payoutsOf("prov-small"), [])

          yield* fundTreasury(share)
          assert.strictEqual((yield* epochs.closeEnded).payouts, 2)
          yield* assertPaidOnce("prov-large", signer, share)
          yield* assertPaidOnce("prov-small", smallSigner, smallShare)
        })
    )

    it.effect("a session turn is paid out once the authorization funding its session has landed", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const epochs = yield* Epochs
        yield* fundTreasury(1_000_000n)
        const signer = yield* registerProvider("prov-session")
        const charge = 6_000
        const share = BigInt(feeSplit(charge).providerShare)
        assert.isAtLeast(Number(share), FLOOR)
        const opening = yield* seedRequest("prov-session", baseEpoch + 50, "pending", charge)
        yield* sql`
          INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, budget, spent,
                                provider_id, model_class, price_in, price_out, expires_at, status)
          VALUES ('ses_payout', 'h', 'payer', 'x402', ${opening}, 100000, ${charge}, 'prov-session', 'chat-medium',
                  800000, 3200000, now() + interval '1 hour', 'open')`
        const turn = yield* seedRequest("prov-session", baseEpoch + 50, { turnOf: "ses_payout" }, charge)

        assert.strictEqual((yield* epochs.closeEnded).payouts, 0)
        assert.isTrue((yield* linkedTo([opening, turn])).every((r) => r.payout_id === null))

        yield* landed(opening)
        assert.strictEqual((yield* epochs.closeEnded).payouts, 1)
        const payout = yield* assertPaidOnce("prov-session", signer, 2n * share)
        assert.isTrue((yield* linkedTo([opening, turn])).every((r) => r.payout_id === payout.payout_id))
      })
    )
  })
})

// ---- which epochs a pass pays: the ended ones, never the current one (D509–D511) ----

/** Epochs long enough that the current one does not end while the test runs. */
const LONG_EPOCH_SECONDS = 10_000_000

describe("a payouts pass pays the unpaid shares of ended epochs and none of the current epoch", () => {
  layer(
    Layer.mergeAll(Ledger.layer, Treasury.layer).pipe(
      Layer.provideMerge(Layer.mergeAll(TestDatabase, Chain.layer)),
      Layer.provideMerge(RouterConfig.layerTest({ epochSeconds: LONG_EPOCH_SECONDS }))
    ),
    { excludeTestServices: true, timeout: 120_000 }
  )((it) => {
    it.effect(
      "every capture path records its receipt's epoch on the request; the last ended epoch is paid whole, the current not at all",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const payouts = yield* makeProviderPayouts({ payoutFloor: FLOOR })
          yield* fundTreasury(1_000_000n)
          const current = epochOf(Date.now(), LONG_EPOCH_SECONDS)
          const ended = current - 1
          const signer = yield* registerProvider("prov-bound")
          const idle = yield* registerProvider("prov-current")

          // The last ended epoch, one share by each way of settling: a key (batched statement), a landed
          // `exact` authorization (batched) and a session turn (a statement of its own).
          const credit = yield* seedRequest("prov-bound", ended, "credit")
          const x402 = yield* seedRequest("prov-bound", ended, "landed")
          const opening = yield* seedRequest("prov-bound", ended, "pending")
          yield* sql`
            INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, budget, spent,
                                  provider_id, model_class, price_in, price_out, expires_at, status)
            VALUES ('ses_bound', 'h', 'payer', 'x402', ${opening}, 100000, ${CHARGE}, 'prov-bound', 'chat-medium',
                    800000, 3200000, now() + interval '1 hour', 'open')`
          const turn = yield* seedRequest("prov-bound", ended, { turnOf: "ses_bound" })
          yield* landed(opening)
          const paidShares = [credit, x402, opening, turn]
          // The current epoch: each provider's shares here reach the floor, and none may be paid.
          const unpaid = [
            ...(yield* Effect.forEach([0, 1, 2], () => seedRequest("prov-bound", current, "credit"))),
            ...(yield* Effect.forEach([0, 1, 2], () => seedRequest("prov-current", current, "landed")))
          ]
          assert.isAtLeast(Number(3n * SHARE), FLOOR)

          const epochs = yield* sql<{ request_id: string; request: number | null; receipt: number }>`
            SELECT q.request_id, q.epoch_id::int AS request, r.epoch_id::int AS receipt
            FROM requests q JOIN receipts r USING (request_id)
            WHERE q.request_id IN ${sql.in([...paidShares, ...unpaid])} ORDER BY q.request_id`
          assert.strictEqual(epochs.length, paidShares.length + unpaid.length)
          for (const row of epochs) assert.strictEqual(row.request, row.receipt, `${row.request_id}'s epoch`)

          assert.strictEqual(yield* payouts.settle, 1)
          const payout = yield* assertPaidOnce("prov-bound", signer, 4n * SHARE)
          const links = yield* linkedTo([...paidShares, ...unpaid])
          assert.deepStrictEqual(
            links.filter((r) => r.payout_id !== null).map((r) => r.request_id),
            [...paidShares].sort()
          )
          assert.isTrue(links.every((r) => r.payout_id === null || r.payout_id === payout.payout_id))
          assert.strictEqual(yield* (yield* Chain).balanceOf(idle), 0n)
          assert.deepStrictEqual(yield* payoutsOf("prov-current"), [])

          // Again: nothing more to pay until the current epoch ends.
          assert.strictEqual(yield* payouts.settle, 0)
          assert.isTrue((yield* linkedTo(unpaid)).every((r) => r.payout_id === null))
        })
    )

    it.effect(
      "a provider with more shares than a statement has bind parameters (40,000 in an ended epoch) is paid them in one transfer (D556)",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const payouts = yield* makeProviderPayouts({ payoutFloor: FLOOR })
          yield* fundTreasury(1_000_000_000n)
          const ended = epochOf(Date.now(), LONG_EPOCH_SECONDS) - 1
          const signer = yield* registerProvider("prov-busy")
          const first = yield* seedRequest("prov-busy", ended, "credit")
          // A busy hour: the one captured request copied 39,999 times, its request, receipt and share.
          const copies = 39_999
          yield* sql`
            INSERT INTO requests
            SELECT c.* FROM requests q, generate_series(1, ${copies}) g,
              LATERAL jsonb_populate_record(NULL::requests, to_jsonb(q) || jsonb_build_object('request_id', q.request_id || '_' || g)) c
            WHERE q.request_id = ${first}`
          yield* sql`
            INSERT INTO receipts
            SELECT c.* FROM receipts r, generate_series(1, ${copies}) g,
              LATERAL jsonb_populate_record(NULL::receipts, to_jsonb(r) || jsonb_build_object('request_id', r.request_id || '_' || g)) c
            WHERE r.request_id = ${first}`
          yield* sql`
            INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
            SELECT l.request_id || '_' || g, l.account, l.kind, l.amount, l.ref
            FROM ledger_entries l, generate_series(1, ${copies}) g
            WHERE l.request_id = ${first} AND l.kind = 'provider_share'`
          // Planned as after a busy hour, once autovacuum has analyzed the tables.
          yield* sql`ANALYZE requests, receipts, ledger_entries`

          assert.strictEqual(yield* payouts.settle, 1)
          const payout = yield* assertPaidOnce("prov-busy", signer, BigInt(copies + 1) * SHARE)
          const [linked] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM requests WHERE provider_id = 'prov-busy' AND payout_id = ${payout.payout_id}`
          assert.strictEqual(linked!.n, copies + 1)
          assert.strictEqual(yield* payouts.settle, 0)
        }),
      { timeout: 120_000 }
    )
  })
})
