import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Authorizations, type ClaimedAuthorization } from "../../src/ledger/Authorizations.ts"
import { lockWaited, TestDatabase } from "../support/Database.ts"
import { pendingReceiptBody } from "../support/SeededReceipt.ts"

/**
 * A landing rewrites up to 32 receipts in one statement; their points trigger locks each receipt's wallet
 * row and its provider's shard. A capture takes its wallet's row, then shards in `(provider, shard)` order
 * (ledger/SettleBatch.ts). The landing locks the same rows first, wallets then shards in that order (D513),
 * so a capture holding a shard the landing needs makes the landing wait before it holds any other.
 */
const Services = Authorizations.layer.pipe(Layer.provideMerge(TestDatabase))

const VALUE = 20_000
const wallet = (tag: string) => `0x${tag.padStart(40, "0")}`

describe("a landing's points locks", () => {
  layer(Services, { timeout: 60_000 })((it) => {
    it.effect(
      "are taken wallets first, then (provider, shard) in order: a capture holding one never forms a cycle",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const authorizations = yield* Authorizations
          // Request ids on chosen shards of the trigger's `hashtext(request_id) & 7`.
          const candidates = Array.from({ length: 64 }, (_, i) => `req_lock_${i}`)
          const shards = yield* sql<{ id: string; shard: number }>`
            SELECT id, (hashtext(id) & 7)::int AS shard FROM unnest(${candidates}::text[]) AS id`
          const on = (shard: number, skip = 0) => shards.filter((r) => r.shard === shard)[skip]!.id
          const [wa, wb, wc] = [wallet("a1"), wallet("b2"), wallet("c3")]
          // Listed in the opposite of the lock order: a later wallet and provider first.
          const seeded = [
            { requestId: on(1), payer: wb, provider: "pb" },
            { requestId: on(4), payer: wc, provider: "pb" },
            { requestId: on(0), payer: wa, provider: "pa" },
            { requestId: on(6), payer: wa, provider: "pa" }
          ]
          const rows: Array<ClaimedAuthorization> = []
          for (const [i, { requestId, payer, provider }] of seeded.entries()) {
            const nonce = `0x${(i + 1).toString(16).padStart(64, "0")}`
            yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                           provider_id, authorized, charged, status)
                     VALUES (${requestId}, 'openai', 'x402', ${payer}, 'auto', 'chat-small', ${provider}, ${VALUE},
                             ${VALUE}, 'captured')`
            yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                                      signature, status, attempts)
                     VALUES (${payer}, ${nonce}, ${requestId}, ${VALUE}, 0, 9999999999, '0x11', 'submitted', 1)`
            yield* sql`INSERT INTO receipts (request_id, epoch_id, body, final)
                     VALUES (${requestId}, 1,
                             ${JSON.stringify({ ...pendingReceiptBody(requestId, payer, VALUE), provider_id: provider })}::jsonb,
                             false)`
            rows.push({
              payer,
              nonce,
              request_id: requestId,
              value: String(VALUE),
              valid_after: "0",
              valid_before: "9999999999",
              signature: "0x11",
              tx_hash: null,
              attempts: 1,
              scheme: "exact",
              ceiling: null,
              reserved_at: "0"
            })
          }
          // A capture of wallet `wa` mid-statement: its wallet row and its shard of `pa` taken, `pb`'s next.
          const held = yield* Deferred.make<void>()
          const next = yield* Deferred.make<void>()
          const capture = yield* Effect.forkChild(
            sql.withTransaction(
              Effect.gen(function* () {
                yield* sql`SELECT 1 FROM points_wallets WHERE wallet = ${wa} FOR UPDATE`
                yield* sql`SELECT 1 FROM points_providers WHERE provider_id = 'pa' AND shard = 0 FOR UPDATE`
                yield* Deferred.succeed(held, undefined)
                yield* Deferred.await(next)
                // NOWAIT: a landing that took this shard before waiting for `wa` would close a cycle here.
                return yield* sql`SELECT 1 FROM points_providers WHERE provider_id = 'pb' AND shard = 1 FOR UPDATE NOWAIT`
              })
            )
          )
          yield* Deferred.await(held)
          const landing = yield* Effect.forkChild(
            authorizations.recordLanded(rows.map((row, i) => ({ row, hash: `0x${String(i).repeat(64)}` })))
          )
          // The landing waits on a row lock (the capture's).
          yield* lockWaited(() => landing.pollUnsafe() !== undefined)
          yield* Deferred.succeed(next, undefined)
          const captured = yield* Fiber.await(capture)
          assert.isTrue(Exit.isSuccess(captured), String(captured))
          const landed = yield* Fiber.join(landing)
          assert.sameMembers(
            [...landed.requestIds],
            seeded.map((s) => s.requestId)
          )
          // The trigger moved each wallet's points from pending to settled.
          const points = yield* sql<{ wallet: string; settled: number; pending: number }>`
            SELECT wallet, settled_charged::int AS settled, pending_charged::int AS pending
            FROM points_wallets ORDER BY wallet`
          assert.deepStrictEqual(points, [
            { wallet: wa, settled: 2 * VALUE, pending: 0 },
            { wallet: wb, settled: VALUE, pending: 0 },
            { wallet: wc, settled: VALUE, pending: 0 }
          ])
        })
    )
  })
})
