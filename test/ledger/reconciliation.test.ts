import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { type Discrepancy, Reconciliation } from "../../src/ledger/Reconciliation.ts"
import { call, routerLayer, routerWithFleet } from "../support/Router.ts"
import { paidCompletion, receiptWhere, waitForBook } from "./support.ts"

interface ReadyBody {
  readonly status: string
  readonly reconciliation: {
    readonly status: string
    readonly last_run_at: number | null
    readonly discrepancies: ReadonlyArray<Discrepancy>
  }
}

const ready = Effect.map(call("/ready"), (r) => ({ status: r.status, body: r.json as ReadyBody }))
const gauge = (name: string) =>
  Effect.map(call("/metrics"), (r) => {
    const line = r.text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`))
    return Number(line?.split(" ").at(-1))
  })

const runOnce = Effect.flatMap(Reconciliation, (r) => r.runOnce)

const kinds = (discrepancies: ReadonlyArray<Discrepancy>) => discrepancies.map((d) => d.kind)

describe("reconciliation against the chain (MAINNET=false)", () => {
  layer(routerWithFleet({ epochSeconds: 2 }), { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.effect(
      "not_run → running → ok; corrupted rows are found, named and shown by /ready and /metrics",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const first = yield* ready
          assert.strictEqual(first.status, 200)
          assert.strictEqual(first.body.reconciliation.status, "not_run")
          assert.isNull(first.body.reconciliation.last_run_at)
          assert.strictEqual(yield* gauge("svc_reconciliation_ok"), 0)

          yield* waitForBook
          const ids = yield* Effect.all(
            [0, 0, 1].map((wallet, i) => paidCompletion(wallet, `Reconcile me ${i}.`)),
            { concurrency: "unbounded" }
          )
          // Settled, refunded and anchored: every kind of movement is on chain.
          for (const id of ids) yield* receiptWhere(id, (r) => r.inclusion !== null, 60_000)

          // A run in progress is visible as `running`.
          const chain = yield* Chain
          const reached = yield* Deferred.make<void>()
          const gate = yield* Deferred.make<void>()
          const slow = yield* Reconciliation.make.pipe(
            Effect.provideService(Chain, {
              ...chain,
              anchoredRoot: (epoch) =>
                Effect.andThen(
                  Effect.andThen(Deferred.succeed(reached, undefined), Deferred.await(gate)),
                  chain.anchoredRoot(epoch)
                )
            })
          )
          const fiber = yield* Effect.forkChild(slow.runOnce)
          yield* Deferred.await(reached)
          const during = yield* ready
          assert.strictEqual(during.body.reconciliation.status, "running")
          yield* Deferred.succeed(gate, undefined)
          const slowResult = yield* Fiber.join(fiber)
          assert.strictEqual(slowResult.status, "ok", JSON.stringify(slowResult.discrepancies))

          const clean = yield* runOnce
          assert.strictEqual(clean.status, "ok", JSON.stringify(clean.discrepancies))
          const ok = yield* ready
          assert.strictEqual(ok.status, 200)
          assert.strictEqual(ok.body.reconciliation.status, "ok")
          assert.isAbove(ok.body.reconciliation.last_run_at!, Date.now() / 1000 - 60)
          assert.strictEqual(yield* gauge("svc_reconciliation_ok"), 1)
          const finishedAt = yield* gauge("svc_reconciliation_last_run_timestamp_seconds")
          assert.isAbove(finishedAt, 0)

          // The next run in progress: /ready says so, and the gauges keep what the last finished run found.
          const again = yield* Deferred.make<void>()
          const held = yield* Deferred.make<void>()
          const next = yield* Effect.forkChild(
            Reconciliation.make.pipe(
              Effect.provideService(Chain, {
                ...chain,
                anchoredRoot: (epoch) =>
                  Effect.andThen(
                    Effect.andThen(Deferred.succeed(again, undefined), Deferred.await(held)),
                    chain.anchoredRoot(epoch)
                  )
              }),
              Effect.flatMap((r) => r.runOnce)
            )
          )
          yield* Deferred.await(again)
          assert.strictEqual((yield* ready).body.reconciliation.status, "running")
          assert.strictEqual(yield* gauge("svc_reconciliation_ok"), 1)
          assert.strictEqual(yield* gauge("svc_reconciliation_last_run_timestamp_seconds"), finishedAt)
          yield* Deferred.succeed(held, undefined)
          assert.strictEqual((yield* Fiber.join(next)).status, "ok")

          // 1. A landed authorization's value no longer matches its transfer on chain.
          const [auth] = yield* sql<{ request_id: string; value: string; tx_hash: string }>`
            SELECT request_id, value::text AS value, tx_hash FROM x402_authorizations
            WHERE request_id = ${ids[0]!}
          `
          yield* sql`UPDATE x402_authorizations SET value = value + 1 WHERE request_id = ${auth!.request_id}`
          const tampered = yield* runOnce
          assert.strictEqual(tampered.status, "failed")
          const transfer = tampered.discrepancies.find((d) => d.kind === "settlement_transfer_mismatch")!
          assert.strictEqual(transfer.request_id, auth!.request_id)
          assert.strictEqual(transfer.tx, auth!.tx_hash)
          assert.strictEqual(transfer.expected, String(BigInt(auth!.value) + 1n))
          assert.strictEqual(transfer.actual, auth!.value)
          assert.includeMembers(kinds(tampered.discrepancies), [
            "settlement_ledger_mismatch",
            "authorization_split_mismatch"
          ])
          const shown = yield* ready
          assert.strictEqual(
            shown.status,
            200,
            "MAINNET=false: a failed reconciliation is reported, not fatal"
          )
          assert.strictEqual(shown.body.status, "ready")
          assert.strictEqual(shown.body.reconciliation.status, "failed")
          assert.strictEqual(shown.body.reconciliation.discrepancies[0]!.request_id, auth!.request_id)
          assert.strictEqual(yield* gauge("svc_reconciliation_ok"), 0)
          yield* sql`UPDATE x402_authorizations SET value = ${auth!.value} WHERE request_id = ${auth!.request_id}`

          // 2. A refund recorded as paid for more than the transfer that paid it.
          const [refund] = yield* sql<{ request_id: string; tx_hash: string; payer: string }>`
            SELECT request_id, tx_hash, payer FROM refunds WHERE status = 'paid' ORDER BY request_id LIMIT 1
          `
          assert.isDefined(refund, "a refund paid on chain")
          yield* sql`UPDATE refunds SET amount = amount + 7 WHERE request_id = ${refund!.request_id}`
          const refunds = yield* runOnce
          assert.strictEqual(refunds.status, "failed")
          const wrongRefund = refunds.discrepancies.find((d) => d.kind === "refund_transfer_mismatch")!
          assert.strictEqual(wrongRefund.tx, refund!.tx_hash)
          assert.isTrue(wrongRefund.request_ids?.includes(refund!.request_id))
          assert.strictEqual(BigInt(wrongRefund.expected!) - BigInt(wrongRefund.actual!), 7n)
          yield* sql`UPDATE refunds SET amount = amount - 7 WHERE request_id = ${refund!.request_id}`

          // 3. A fee row that no longer adds up with the provider's share to the charge.
          yield* sql`UPDATE ledger_entries SET amount = amount + 1 WHERE kind = 'router_fee' AND request_id = ${ids[2]!}`
          const fees = yield* runOnce
          assert.deepStrictEqual(kinds(fees.discrepancies), ["fee_split_mismatch"])
          assert.strictEqual(fees.discrepancies[0]!.request_id, ids[2])
          yield* sql`UPDATE ledger_entries SET amount = amount - 1 WHERE kind = 'router_fee' AND request_id = ${ids[2]!}`

          // 4. A ledger movement with no transaction behind it: the treasury totals disagree.
          yield* sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                     VALUES (${ids[1]!}, 'treasury', 'settled', 1000, 'forged')`
          const forged = yield* runOnce
          assert.includeMembers(kinds(forged.discrepancies), ["treasury_mismatch"])
          yield* sql`DELETE FROM ledger_entries WHERE ref = 'forged'`

          const repaired = yield* runOnce
          assert.strictEqual(repaired.status, "ok", JSON.stringify(repaired.discrepancies))
          assert.strictEqual((yield* ready).body.reconciliation.status, "ok")
        }),
      { timeout: 180_000 }
    )
  })
})

describe("reconciliation gates readiness on mainnet (MAINNET=true)", () => {
  layer(routerLayer({ mainnet: true }), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a failed run makes /ready 503 with the discrepancy; a clean run makes it ready again", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        assert.strictEqual((yield* ready).body.reconciliation.status, "not_run")
        assert.strictEqual((yield* ready).status, 200)
        assert.strictEqual((yield* runOnce).status, "ok")
        assert.strictEqual((yield* ready).status, 200)

        // A landed authorization whose transaction the chain has never seen.
        const payer = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
        const tx = `0x${"5a".repeat(32)}`
        yield* sql`
          INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                provider_id, authorized, charged, status)
          VALUES ('req_forged', 'openai', 'x402', ${payer}, 'chat-small', 'chat-small', 'prov-a', 900, 900, 'captured')
        `
        yield* sql`
          INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before, status, tx_hash)
          VALUES (${payer}, ${`0x${"01".repeat(32)}`}, 'req_forged', 900, 0, 0, 'landed', ${tx})
        `
        const failed = yield* runOnce
        assert.strictEqual(failed.status, "failed")
        const missing = failed.discrepancies.find((d) => d.kind === "settlement_tx_missing")!
        assert.strictEqual(missing.request_id, "req_forged")
        assert.strictEqual(missing.tx, tx)

        const gated = yield* ready
        assert.strictEqual(gated.status, 503)
        assert.strictEqual(gated.body.status, "not_ready")
        assert.strictEqual(gated.body.reconciliation.status, "failed")
        assert.strictEqual(gated.body.reconciliation.discrepancies[0]!.request_id, "req_forged")

        yield* sql`DELETE FROM x402_authorizations WHERE request_id = 'req_forged'`
        yield* sql`DELETE FROM requests WHERE request_id = 'req_forged'`
        assert.strictEqual((yield* runOnce).status, "ok")
        assert.strictEqual((yield* ready).status, 200)
      })
    )
  })
})
