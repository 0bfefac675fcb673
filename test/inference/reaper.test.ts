import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { randomAuthorizationNonce } from "../../src/chain/Eip3009.ts"
import { INSTANCE_ID, Instances } from "../../src/db/Instances.ts"
import { Reaper } from "../../src/inference/Reaper.ts"
import { Authorizations } from "../../src/ledger/Authorizations.ts"
import { Ledger, uptoNonceKey } from "../../src/ledger/Ledger.ts"
import { meterRecordOf } from "../../src/ledger/Metered.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { call, routerLayer } from "../support/Router.ts"

/** A key-paid request's reservation as the admission writes it. */
const reservation = (payer: string, requestId: string, authorized: number) => ({
  requestId,
  dialect: "openai",
  payer,
  requestedModel: "auto",
  modelClass: "chat-small",
  providerId: "p",
  authorized,
  agent: {}
})

/**
 * This router's own beats as if they had been steady for a minute: a new instance judges nobody dead
 * until its beats have been steady `INSTANCE_DEAD_AFTER_SECONDS` (D293, D401).
 */
const steadyForAMinute = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql`UPDATE router_instances SET beating_since = now() - interval '1 minute' WHERE instance_id = ${INSTANCE_ID}`
).pipe(Effect.orDie)

describe("reservations left by a dead request", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 60_000 })((it) => {
    // First in this block: this router (a new instance) started seconds ago.
    it.effect("a new instance judges nobody dead before its own beats have been steady long enough", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const instances = yield* Instances
        // It may have started right after a stall of the database: another instance whose last beat is
        // 40 s old may be about to beat again.
        yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                   VALUES ('i_silent', now() - interval '40 seconds')`
        const mine = yield* sql<{ steady_for: number }>`
          SELECT extract(epoch FROM heartbeat_at - beating_since)::float8 AS steady_for
          FROM router_instances WHERE instance_id = ${INSTANCE_ID}`
        assert.isBelow(mine[0]!.steady_for, instances.deadAfterSeconds)
        assert.isFalse((yield* instances.dead).includes("i_silent"))
        // Once its beats have been steady that long, the silent one is dead.
        yield* steadyForAMinute
        assert.isTrue((yield* instances.dead).includes("i_silent"))
        yield* sql`DELETE FROM router_instances WHERE instance_id = 'i_silent'`
      })
    )

    it.effect("are released in full with a signed receipt; fresh ones are left alone", () =>
      Effect.gen(function* () {
        const ledger = yield* Ledger
        const sql = yield* SqlClient.SqlClient
        const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const record = (requestId: string) => reservation(key.wallet, requestId, 5_000)
        yield* ledger.reserveCredit(record("req_dead"), key.keyId)
        yield* ledger.reserveCredit(record("req_alive"), key.keyId)
        // An instance died two hours ago while serving req_dead.
        yield* sql`UPDATE requests SET created_at = now() - interval '2 hours' WHERE request_id = 'req_dead'`
        assert.strictEqual((yield* keyState(key.keyId)).reserved, 10_000)
        const reaper = yield* Reaper
        assert.strictEqual(yield* reaper.runOnce, 1)
        const state = yield* keyState(key.keyId)
        assert.deepStrictEqual([state.reserved, state.spent, state.walletReserved], [5_000, 0, 5_000])
        const statuses = yield* sql<{ request_id: string; status: string }>`
          SELECT request_id, status FROM requests ORDER BY request_id`
        assert.deepStrictEqual(
          statuses.map((r) => [r.request_id, r.status]),
          [
            ["req_alive", "reserved"],
            ["req_dead", "released"]
          ]
        )
        const receipt = (yield* call("/v1/receipts/req_dead")).json as {
          receipt: { status: string; charged: number }
          final: boolean
        }
        assert.deepStrictEqual(
          [receipt.receipt.status, receipt.receipt.charged, receipt.final],
          ["released", 0, true]
        )
        assert.strictEqual(yield* reaper.runOnce, 0)
      })
    )

    it.effect(
      "a dead router instance's leases and reservations are settled as soon as its heartbeat stops",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          const record = (requestId: string) => reservation(key.wallet, requestId, 3_000)
          // This instance registered itself; what it writes names it, through its connections.
          const me = yield* sql<{ alive: boolean }>`
          SELECT heartbeat_at > now() - interval '30 seconds' AS alive FROM router_instances
          WHERE instance_id = ${INSTANCE_ID} AND stopped_at IS NULL`
          assert.deepStrictEqual(me, [{ alive: true }])
          yield* ledger.reserveCredit(record("req_mine"), key.keyId)
          yield* ledger.reserveCredit(record("req_of_dead"), key.keyId)
          yield* ledger.reserveCredit(record("req_of_alive"), key.keyId)
          yield* ledger.reserveCredit(record("req_of_resumed"), key.keyId)
          const mine = yield* sql<{
            instance_id: string
          }>`SELECT instance_id FROM requests WHERE request_id = 'req_mine'`
          assert.strictEqual(mine[0]!.instance_id, INSTANCE_ID)
          // Another instance died 40 seconds ago mid-request; a third is alive and serving.
          yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                   VALUES ('i_dead', now() - interval '40 seconds'), ('i_alive', now())`
          yield* sql`UPDATE requests SET instance_id = 'i_dead', created_at = now() - interval '41 seconds'
                   WHERE request_id = 'req_of_dead'`
          yield* sql`UPDATE requests SET instance_id = 'i_alive' WHERE request_id = 'req_of_alive'`
          // The dead one opened a request just now, 40 s after its last beat: resumed, it serves it (D563).
          yield* sql`UPDATE requests SET instance_id = 'i_dead' WHERE request_id = 'req_of_resumed'`
          // The dead one's leases: one written before its last beat, one 3 s after it (it died before the next),
          // and one written now, 40 s after it (D561): it was frozen, not dead, and serves that request again.
          yield* sql`INSERT INTO capacity_leases (lease_id, provider_id, model_class, acquired_at, expires_at, instance_id)
                   VALUES ('l_dead', 'p', 'chat-small', now() - interval '41 seconds', now() + interval '20 minutes', 'i_dead'),
                          ('l_dead_late', 'p', 'chat-small', now() - interval '37 seconds', now() + interval '20 minutes', 'i_dead'),
                          ('l_resumed', 'p', 'chat-small', now(), now() + interval '20 minutes', 'i_dead'),
                          ('l_alive', 'p', 'chat-small', now(), now() + interval '20 minutes', 'i_alive')`
          yield* sql`INSERT INTO capacity_leases (lease_id, provider_id, model_class, expires_at)
                   VALUES ('l_mine', 'p', 'chat-small', now() + interval '20 minutes')`

          yield* steadyForAMinute
          // An instance that beats again (judged dead a moment ago, say) keeps its leases.
          const instances = yield* Instances
          assert.strictEqual(yield* instances.releaseLeases(["i_alive"]), 0)
          // Nor are its reservations settled (D563).
          assert.deepStrictEqual(yield* ledger.reservationsOf(["i_alive"], instances.leftByDead), [])
          assert.strictEqual(yield* reaper.settleDeadInstances, 1)
          const statuses = yield* sql<{ request_id: string; status: string }>`
          SELECT request_id, status FROM requests WHERE payer = ${key.wallet} ORDER BY request_id`
          assert.deepStrictEqual(
            statuses.map((r) => [r.request_id, r.status]),
            [
              ["req_mine", "reserved"],
              ["req_of_alive", "reserved"],
              ["req_of_dead", "released"],
              ["req_of_resumed", "reserved"]
            ]
          )
          const leases = yield* sql<{ lease_id: string; instance_id: string }>`
          SELECT lease_id, instance_id FROM capacity_leases ORDER BY lease_id`
          assert.deepStrictEqual(
            leases.map((l) => [l.lease_id, l.instance_id]),
            [
              ["l_alive", "i_alive"],
              ["l_mine", INSTANCE_ID],
              ["l_resumed", "i_dead"]
            ]
          )
          const receipt = (yield* call("/v1/receipts/req_of_dead")).json as {
            receipt: { status: string; charged: number }
          }
          assert.deepStrictEqual([receipt.receipt.status, receipt.receipt.charged], ["released", 0])
          assert.strictEqual((yield* keyState(key.keyId)).reserved, 9_000)
          // What it wrote after resuming keeps it visited, not settled (D563)...
          const settled = sql<{ settled: boolean }>`
          SELECT settled_at IS NOT NULL AS settled FROM router_instances WHERE instance_id = 'i_dead'`
          assert.strictEqual(yield* reaper.settleDeadInstances, 0)
          assert.deepStrictEqual(yield* settled, [{ settled: false }])
          // ...until it has been silent for the dead-after time since (30 s, this router's beats steady): it
          // died again, and that lease and that reservation go too.
          yield* sql`UPDATE router_instances SET heartbeat_at = heartbeat_at - interval '31 seconds'
                     WHERE instance_id = 'i_dead'`
          yield* sql`UPDATE capacity_leases SET acquired_at = acquired_at - interval '31 seconds'
                     WHERE instance_id = 'i_dead'`
          yield* sql`UPDATE requests SET created_at = created_at - interval '31 seconds'
                     WHERE request_id = 'req_of_resumed'`
          assert.strictEqual(yield* reaper.settleDeadInstances, 1)
          assert.deepStrictEqual(
            (yield* sql<{
              lease_id: string
            }>`SELECT lease_id FROM capacity_leases WHERE instance_id = 'i_dead'`).length,
            0
          )
          assert.strictEqual((yield* keyState(key.keyId)).reserved, 6_000)
          // Settled once nothing of it is left: not visited again.
          assert.deepStrictEqual(yield* settled, [{ settled: true }])
          assert.strictEqual(yield* reaper.settleDeadInstances, 0)
          // Unless a row of it shows up after that (written after it resumed, committed after the pass that
          // marked it): a settled dead instance holding a lease is visited again, and the lease goes.
          yield* sql`INSERT INTO capacity_leases (lease_id, provider_id, model_class, acquired_at, expires_at, instance_id)
                     VALUES ('l_after_settled', 'p', 'chat-small', now() - interval '31 seconds',
                             now() + interval '20 minutes', 'i_dead')`
          assert.isTrue((yield* instances.dead).includes("i_dead"))
          yield* reaper.settleDeadInstances
          assert.deepStrictEqual(
            (yield* sql<{
              lease_id: string
            }>`SELECT lease_id FROM capacity_leases WHERE instance_id = 'i_dead'`).length,
            0
          )
          assert.isFalse((yield* instances.dead).includes("i_dead"))
        })
    )

    it.effect("an expired session whose opening never reserved its funding is discarded, not kept busy", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const reaper = yield* Reaper
        // The opening's instance died after recording the session and before reserving its funding.
        yield* sql`INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, budget,
                                         provider_id, model_class, price_in, price_out, expires_at, status, in_flight)
                   VALUES ('ses_unfunded', 'h', '0xunfunded', 'x402', 'req_never_reserved', 100000, 'p',
                           'chat-medium', 800000, 3200000, now() - interval '1 second', 'open', 'req_never_reserved')`
        yield* reaper.runOnce
        const left = yield* sql`SELECT session_id FROM sessions WHERE session_id = 'ses_unfunded'`
        assert.strictEqual(left.length, 0)
      })
    )

    it.effect(
      "an Idempotency-Key claim a dead instance held is freed; a live instance's claim and a done key stay",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          // A claim taken by an instance that was then killed (its release never ran), one of a live
          // instance, and a done key of the dead instance (it answered: its replay must stay).
          // And one it took just now, 40 s after its last beat: frozen and resumed, it serves it (D563).
          yield* sql`INSERT INTO idempotency_keys (key, body_hash, state, instance_id, created_at) VALUES
                       ('idem_dead_claim', 'h', 'in_progress', 'i_died_claiming', now() - interval '41 seconds'),
                       ('idem_dead_done', 'h', 'done', 'i_died_claiming', now() - interval '41 seconds'),
                       ('idem_live_claim', 'h', 'in_progress', ${INSTANCE_ID}, now()),
                       ('idem_resumed_claim', 'h', 'in_progress', 'i_died_claiming', now())`
          yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                     VALUES ('i_died_claiming', now() - interval '40 seconds')`

          yield* steadyForAMinute
          yield* reaper.settleDeadInstances
          const rows = yield* sql<{ key: string; state: string }>`
            SELECT key, state FROM idempotency_keys WHERE key LIKE 'idem_%' ORDER BY key`
          assert.deepStrictEqual(
            rows.map((r) => [r.key, r.state]),
            [
              ["idem_dead_done", "done"],
              ["idem_live_claim", "in_progress"],
              ["idem_resumed_claim", "in_progress"]
            ]
          )
          yield* sql`DELETE FROM idempotency_keys WHERE key LIKE 'idem_%'`
        })
    )

    it.effect(
      "a dead instance's open request is billed what its recorded meter delivered, the rest released, with a receipt",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          const record = (requestId: string) => reservation(key.wallet, requestId, 8_000)
          yield* ledger.reserveCredit(record("req_streaming"), key.keyId)
          yield* ledger.reserveCredit(record("req_before_first_token"), key.keyId)
          // The instance was streaming req_streaming when it died: its last checkpoint says 2,500 delivered.
          yield* ledger.recordMeter(
            "req_streaming",
            meterRecordOf({
              charged: 2_500,
              tokens: { input: 100, cachedInput: 0, output: 40 },
              providerId: "p-fallback",
              modelClass: "chat-small",
              tariff: { price_in: 5_000, price_out: 50_000 },
              ttftMs: 180,
              status: "partial",
              final: false
            })
          )
          // Its requests name it before it is known dead (the router's own 5-second pass may settle them first),
          // opened before its last beat (D563).
          yield* sql`UPDATE requests SET instance_id = 'i_died_streaming', created_at = now() - interval '41 seconds'
                   WHERE request_id IN ('req_streaming', 'req_before_first_token')`
          yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                   VALUES ('i_died_streaming', now() - interval '40 seconds')`

          yield* steadyForAMinute
          yield* reaper.settleDeadInstances
          const rows = yield* sql<{ request_id: string; status: string; charged: string }>`
            SELECT request_id, status, charged::text FROM requests WHERE payer = ${key.wallet} ORDER BY request_id`
          assert.deepStrictEqual(
            rows.map((r) => [r.request_id, r.status, Number(r.charged)]),
            [
              ["req_before_first_token", "released", 0],
              ["req_streaming", "captured", 2_500]
            ]
          )
          // The key paid what was delivered; both reservations are gone.
          const state = yield* keyState(key.keyId)
          assert.deepStrictEqual(
            [state.reserved, state.spent, state.walletReserved, state.available],
            [0, 2_500, 0, 997_500]
          )
          const receipt = (yield* call("/v1/receipts/req_streaming")).json as {
            receipt: {
              status: string
              charged: number
              authorized: number
              out_tokens: number
              provider_id: string
            }
          }
          assert.deepInclude(receipt.receipt, {
            status: "partial",
            charged: 2_500,
            authorized: 8_000,
            out_tokens: 40,
            provider_id: "p-fallback"
          })
          const released = (yield* call("/v1/receipts/req_before_first_token")).json as {
            receipt: { status: string; charged: number }
          }
          assert.deepInclude(released.receipt, { status: "released", charged: 0 })
        })
    )

    it.effect(
      "a dead instance's x402 requests are billed from their meters: exact submits and refunds the rest, upto settles only the charge",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          const payer = "0x90f79bf6eb2c4f870365e785982e1f101e93b906"
          const hold = {
            validAfter: 0n,
            validBefore: 9_999_999_999n,
            signature: "0x01" as const
          }
          yield* ledger.reserveX402(reservation(payer, "req_exact", 9_000), {
            ...hold,
            nonce: randomAuthorizationNonce()
          })
          yield* ledger.reserveX402(reservation(payer, "req_upto", 9_000), {
            ...hold,
            scheme: "upto",
            nonce: uptoNonceKey(BigInt(Date.now()))
          })
          const metered = meterRecordOf({
            charged: 1_200,
            tokens: { input: 50, cachedInput: 0, output: 20 },
            providerId: "p",
            modelClass: "chat-small",
            tariff: { price_in: 4_000, price_out: 50_000 },
            ttftMs: 90,
            status: "partial",
            final: false
          })
          // Its authorization expires before any transfer could land: nothing can be collected for it.
          yield* ledger.reserveX402(reservation(payer, "req_lapsing", 9_000), {
            ...hold,
            validBefore: BigInt(Math.floor(Date.now() / 1000) + 30),
            nonce: randomAuthorizationNonce()
          })
          yield* ledger.recordMeter("req_exact", metered)
          yield* ledger.recordMeter("req_upto", metered)
          yield* ledger.recordMeter("req_lapsing", metered)
          // Its requests name it before it is known dead (the router's own 5-second pass may settle them first),
          // opened before its last beat (D563).
          yield* sql`UPDATE requests SET instance_id = 'i_died_paying', created_at = now() - interval '41 seconds'
                   WHERE request_id IN ('req_exact', 'req_upto', 'req_lapsing')`
          yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                   VALUES ('i_died_paying', now() - interval '40 seconds')`

          yield* steadyForAMinute
          yield* reaper.settleDeadInstances
          const rows = yield* sql<{
            request_id: string
            status: string
            charged: string
            auth: string
            value: string
          }>`
            SELECT r.request_id, r.status, r.charged::text, a.status AS auth, a.value::text AS value
            FROM requests r JOIN x402_authorizations a USING (request_id)
            WHERE r.request_id IN ('req_exact', 'req_upto', 'req_lapsing') ORDER BY r.request_id`
          // Queued for settlement: the router's own settlement pass may have taken it already (`submitted`).
          const queued = (auth: string) => (auth === "submitted" ? "pending" : auth)
          assert.deepStrictEqual(
            rows.map((r) => [r.request_id, r.status, Number(r.charged), queued(r.auth), Number(r.value)]),
            [
              // exact: the whole authorization is submitted; what it did not deliver is a refund due.
              ["req_exact", "captured", 1_200, "pending", 9_000],
              // Lapsing before a transfer could land: released whole, its signature erased, nothing owed.
              ["req_lapsing", "released", 0, "released", 9_000],
              // upto: the proxy moves exactly the charge; the unused ceiling is never taken.
              ["req_upto", "captured", 1_200, "pending", 1_200]
            ]
          )
          const refunds = yield* sql<{
            amount: string
          }>`SELECT amount::text FROM refunds WHERE request_id = 'req_exact'`
          assert.deepStrictEqual(
            refunds.map((r) => Number(r.amount)),
            [7_800]
          )
          assert.deepStrictEqual(
            yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM refunds WHERE request_id = 'req_upto'`,
            [{ n: 0 }]
          )
        })
    )

    it.effect(
      "a settlement this instance gave up on is settled from its final record; one still serving is left alone",
      () =>
        Effect.gen(function* () {
          const ledger = yield* Ledger
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          yield* ledger.reserveCredit(reservation(key.wallet, "req_given_up", 6_000), key.keyId)
          yield* ledger.reserveCredit(reservation(key.wallet, "req_still_serving", 6_000), key.keyId)
          const meter = (final: boolean) =>
            meterRecordOf({
              charged: 900,
              tokens: { input: 30, cachedInput: 0, output: 12 },
              providerId: "p",
              modelClass: "chat-small",
              tariff: { price_in: 5_000, price_out: 60_000 },
              ttftMs: 75,
              status: final ? "ok" : "partial",
              final
            })
          // The background retry recorded the final meter and then gave up; the other only has a checkpoint.
          yield* ledger.recordMeter("req_given_up", meter(true))
          yield* ledger.recordMeter("req_still_serving", meter(false))

          // (The router's own 5-second pass may get there first.)
          yield* reaper.settleGivenUp
          const rows = yield* sql<{ request_id: string; status: string; charged: string | null }>`
            SELECT request_id, status, charged::text FROM requests WHERE payer = ${key.wallet} ORDER BY request_id`
          assert.deepStrictEqual(
            rows.map((r) => [r.request_id, r.status, r.charged === null ? null : Number(r.charged)]),
            [
              ["req_given_up", "captured", 900],
              ["req_still_serving", "reserved", null]
            ]
          )
          const receipt = (yield* call("/v1/receipts/req_given_up")).json as {
            receipt: { status: string; charged: number }
          }
          assert.deepInclude(receipt.receipt, { status: "ok", charged: 900 })
          assert.strictEqual(yield* reaper.settleGivenUp, 0)
          // Leaves nothing of this instance open for the tests after it.
          yield* sql`UPDATE requests SET created_at = now() - interval '2 hours' WHERE request_id = 'req_still_serving'`
          yield* reaper.runOnce
        })
    )

    it.effect(
      "an expired session nobody closed is settled: its key reservation goes back, less what it spent",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          // A key-funded session of 10,000 that spent 2,000 and expired a minute ago.
          yield* sql`UPDATE api_keys SET reserved = 10000 WHERE key_id = ${key.keyId}`
          yield* sql`UPDATE wallet_balances SET available = available - 10000, reserved = 10000 WHERE wallet = ${key.wallet}`
          yield* sql`INSERT INTO sessions (session_id, token_hash, payer, funding_kind, funding_request_id, key_id, budget,
                                         spent, provider_id, model_class, price_in, price_out, expires_at, status, turns)
                   VALUES ('s-expired', 'x', ${key.wallet}, 'credit', 'req_open', ${key.keyId}, 10000, 2000, 'p',
                           'chat-medium', 1, 1, now() - interval '1 minute', 'open', 2)`
          const reaper = yield* Reaper
          yield* reaper.runOnce
          const state = yield* keyState(key.keyId)
          assert.deepStrictEqual(
            [state.reserved, state.spent, state.walletReserved, state.available],
            [0, 2000, 0, 998_000]
          )
          const rows = yield* sql<{
            status: string
          }>`SELECT status FROM sessions WHERE session_id = 's-expired'`
          assert.strictEqual(rows[0]!.status, "closed")
        })
    )

    it.effect(
      "the x402 settlements a dead instance claimed go back to the queue at once, not after 3 minutes",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          const authorizations = yield* Authorizations
          // Captured x402 requests whose settlement was claimed just now; no signature is on record, so the
          // live settlement loop of this test's router only ever sends such a row back to `pending`.
          const authorization = (requestId: string, nonce: string, status: string) =>
            Effect.gen(function* () {
              yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                               provider_id, authorized, charged, status)
                         VALUES (${requestId}, 'openai', 'x402', '0xclaims', 'auto', 'chat-small', 'p', 10000, 10,
                                 'captured')`
              yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                                          signature, status)
                         VALUES ('0xclaims', ${nonce}, ${requestId}, 10000, 0, 99999999999, NULL, ${status})`
            })
          // Claimed by this instance: the claim names it.
          yield* authorization("req_claim_mine", "0x01", "pending")
          yield* authorizations.claimDue
          const mine = yield* sql<{ claimed_by: string | null }>`
            SELECT claimed_by FROM x402_authorizations WHERE nonce = '0x01'`
          assert.strictEqual(mine[0]!.claimed_by, INSTANCE_ID)

          // An instance died 40 seconds ago right after claiming one (maybe after broadcasting it); another,
          // alive, is settling its own claim.
          yield* authorization("req_claim_dead", "0x02", "submitted")
          yield* authorization("req_claim_alive", "0x03", "submitted")
          yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                     VALUES ('i_dead_claims', now() - interval '40 seconds'), ('i_alive_claims', now())`
          yield* sql`UPDATE x402_authorizations SET claimed_by = 'i_dead_claims', updated_at = now() - interval '41 seconds'
                     WHERE nonce = '0x02'`
          // The dead one claimed another just now, 40 s after its last beat: resumed, it is settling it (D563).
          yield* authorization("req_claim_resumed", "0x04", "submitted")
          yield* sql`UPDATE x402_authorizations SET claimed_by = 'i_dead_claims' WHERE nonce = '0x04'`
          yield* sql`UPDATE x402_authorizations SET claimed_by = 'i_alive_claims' WHERE nonce = '0x03'`

          yield* steadyForAMinute
          yield* reaper.settleDeadInstances
          const rows = yield* sql<{ nonce: string; status: string; claimed_by: string }>`
            SELECT nonce, status, claimed_by FROM x402_authorizations WHERE nonce IN ('0x02', '0x03') ORDER BY nonce`
          // The dead instance's claim is back in the queue (or already claimed again by a live loop).
          const dead = rows[0]!
          assert.isFalse(
            dead.status === "submitted" && dead.claimed_by === "i_dead_claims",
            JSON.stringify(dead)
          )
          assert.deepStrictEqual([rows[1]!.status, rows[1]!.claimed_by], ["submitted", "i_alive_claims"])
          const resumed = yield* sql<{ status: string; claimed_by: string }>`
            SELECT status, claimed_by FROM x402_authorizations WHERE nonce = '0x04'`
          assert.deepStrictEqual([resumed[0]!.status, resumed[0]!.claimed_by], ["submitted", "i_dead_claims"])
          yield* sql`DELETE FROM x402_authorizations WHERE payer = '0xclaims'`
          yield* sql`DELETE FROM requests WHERE payer = '0xclaims'`
        })
    )

    it.effect(
      "right after a stall of its own, an instance judges nobody dead until the others had time to beat again",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const instances = yield* Instances
          // One transaction, so this instance's own beat waits (on its row) until the pass has looked.
          const deadNow = (steadyFor: string) =>
            Effect.gen(function* () {
              // This instance's beat just got through after a stall (its beats steady since `steadyFor` ago);
              // the other's last beat is from before the stall and its next one is still to come.
              yield* sql`UPDATE router_instances SET heartbeat_at = now(),
                           beating_since = now() - ${steadyFor}::interval WHERE instance_id = ${INSTANCE_ID}`
              yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                         VALUES ('i_not_beaten_yet', now() - interval '40 seconds')
                         ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at`
              const dead = yield* instances.dead
              yield* sql`UPDATE router_instances SET beating_since = '-infinity' WHERE instance_id = ${INSTANCE_ID}`
              return dead.includes("i_not_beaten_yet")
            }).pipe(sql.withTransaction)
          assert.isFalse(yield* deadNow("0 seconds"))
          // Steady for longer than INSTANCE_DEAD_AFTER_SECONDS while the other stayed silent: dead.
          assert.isTrue(yield* deadNow("60 seconds"))
          yield* sql`DELETE FROM router_instances WHERE instance_id = 'i_not_beaten_yet'`
        })
    )

    it.effect(
      "a stall of the database is no death: an instance as silent as this one keeps its requests",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const reaper = yield* Reaper
          const ledger = yield* Ledger
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          yield* ledger.reserveCredit(reservation(key.wallet, "req_of_stalled", 2_000), key.keyId)
          // The database answered nobody for 40 s: every heartbeat, this instance's own too, is 40 s old when
          // it answers again. One transaction, so this instance's own beat waits (on its row) until the pass
          // has looked; the pass's statements run on this transaction's connection.
          const pass = Effect.gen(function* () {
            yield* sql`INSERT INTO router_instances (instance_id, heartbeat_at)
                       VALUES ('i_stalled', now() - interval '40 seconds')`
            yield* sql`UPDATE router_instances SET heartbeat_at = now() - interval '40 seconds'
                       WHERE instance_id = ${INSTANCE_ID}`
            yield* sql`UPDATE requests SET instance_id = 'i_stalled', created_at = now() - interval '41 seconds'
                       WHERE request_id = 'req_of_stalled'`
            const released = yield* reaper.settleDeadInstances
            const state = yield* sql<{ status: string; settled: boolean }>`
              SELECT q.status, i.settled_at IS NOT NULL AS settled
              FROM requests q JOIN router_instances i ON i.instance_id = q.instance_id
              WHERE q.request_id = 'req_of_stalled'`
            // Back to a live heartbeat before the other passes of this router can look.
            yield* sql`UPDATE router_instances SET heartbeat_at = now() WHERE instance_id IN (${INSTANCE_ID}, 'i_stalled')`
            return { released, state }
          }).pipe(sql.withTransaction)
          const { released, state } = yield* pass
          assert.strictEqual(released, 0)
          assert.deepStrictEqual(state, [{ status: "reserved", settled: false }])

          // Silent while this instance's beats got through: dead, and its request is settled.
          yield* sql`UPDATE router_instances SET heartbeat_at = now() - interval '40 seconds' WHERE instance_id = 'i_stalled'`
          // (This router's own pass may settle it first: either way, it is settled.)
          yield* steadyForAMinute
          yield* reaper.settleDeadInstances
          const after = yield* sql<{
            status: string
          }>`SELECT status FROM requests WHERE request_id = 'req_of_stalled'`
          assert.strictEqual(after[0]!.status, "released")
        })
    )
  })
})
