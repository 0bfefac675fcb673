import { assert, describe, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import type { ProviderConfig } from "../../src/devnet/fleet/FleetConfig.ts"
import { Receipts } from "../../src/ledger/Receipts.ts"
import { fundedKey } from "../support/Keys.ts"
import { holdInTransaction } from "../support/Locks.ts"
import { waitForQuote } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"

/**
 * D534: a call paid by a funded key (or an x402 authorization) gets its reply as soon as the reply is
 * known, before the statement that settles it commits; a receipt read waits for that statement (in the
 * instance that served it, for its work; in any instance, while the request is still `reserved`). A
 * session's turn still answers only once settled: the next turn takes the session after it.
 *
 * The settling statement is held up by a transaction that locks `receipts` against writes (every
 * settlement inserts its receipt; the reservation writes none), so the order is observable.
 */
const provider: ProviderConfig = {
  providerId: "rbs-1",
  dialect: "openai",
  offers: [
    {
      modelClass: "chat-small",
      priceIn: 100_000,
      priceOut: 400_000,
      session: { priceInCached: 50_000, sessionTtlS: 300 }
    }
  ],
  ttftMs: 0,
  tokensPerSecond: 100_000,
  capacityRps: 64,
  maxContext: 32_000
}

const chat = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "chat-small",
  messages: [{ role: "user", content }],
  max_tokens: 16,
  ...extra
})

/**
 * Runs `body` while another connection holds `receipts` locked against writes; `body` gets the effect that
 * lets the lock go (and waits until it is gone). Unlocked on every exit.
 */
const withReceiptsLocked = <A, E, R>(body: (unlock: Effect.Effect<void>) => Effect.Effect<A, E, R>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const unlock = yield* holdInTransaction(sql`LOCK TABLE receipts IN EXCLUSIVE MODE`)
      return yield* body(Effect.asVoid(unlock)).pipe(Effect.ensuring(unlock))
    })
  )

const statusOf = (requestId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ status: string }>`SELECT status FROM requests WHERE request_id = ${requestId}`
    return rows[0]?.status
  }).pipe(Effect.orDie)

describe("the reply and the settlement (D534)", () => {
  layer(routerWithFleet({}, [provider]), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a key-paid reply comes before its settlement commits; the receipt read waits for it", () =>
      Effect.gen(function* () {
        yield* waitForQuote("chat-small")
        const key = yield* fundedKey({ budget: 100_000_000, balance: 100_000_000 })
        const warm = yield* postJson("/v1/chat/completions", chat("warm"), { "x-credit-key": key.secret })
        assert.strictEqual(warm.status, 200, warm.text)

        yield* withReceiptsLocked((unlock) =>
          Effect.gen(function* () {
            // Answered while the settlement cannot commit (it would wait here for the lock before D534).
            const reply = yield* postJson("/v1/chat/completions", chat("answer me first"), {
              "x-credit-key": key.secret
            }).pipe(Effect.timeout("10 seconds"))
            assert.strictEqual(reply.status, 200, reply.text)
            const id = reply.headers.get("x-request-id")!
            const body = reply.json as { usage: { cost: number }; choices: ReadonlyArray<unknown> }
            assert.lengthOf(body.choices, 1)
            assert.strictEqual(yield* statusOf(id), "reserved")
            // A stop of the answered stream has nothing to stop: answered now, not once it is settled.
            const stopped = yield* call(`/v1/streams/${id}/stop`, {
              method: "POST",
              headers: { "x-stream-token": reply.headers.get("x-stream-token")! }
            }).pipe(Effect.timeout("1500 millis"))
            assert.strictEqual(stopped.status, 200, stopped.text)
            assert.strictEqual(yield* statusOf(id), "reserved")

            // The receipt read waits for the settlement instead of answering 404; so does a read through the
            // book alone, as another instance (which does not serve this request) reads it.
            const receipt = yield* Effect.forkChild(call(`/v1/receipts/${id}`))
            const elsewhere = yield* Effect.forkChild((yield* Receipts).receipt(id))
            yield* Effect.sleep("500 millis")
            assert.isUndefined(receipt.pollUnsafe(), "the receipt read waits while the settlement is held")
            assert.isUndefined(
              elsewhere.pollUnsafe(),
              "a read of the book waits while the request is reserved"
            )
            yield* unlock
            assert.strictEqual((yield* Fiber.join(elsewhere)).receipt.request_id, id)
            const read = yield* Fiber.join(receipt)
            assert.strictEqual(read.status, 200, read.text)
            const charged = (read.json as { receipt: { charged: number } }).receipt.charged
            assert.isAbove(charged, 0)
            assert.strictEqual(yield* statusOf(id), "captured")
          })
        )
      })
    )

    it.effect(
      "a session's turn answers only once it is settled, so the next turn finds the session free",
      () =>
        Effect.gen(function* () {
          yield* waitForQuote("chat-small")
          const key = yield* fundedKey({ budget: 100_000_000, balance: 100_000_000 })
          const sessionId = `sess-rbs-${Math.random().toString(36).slice(2)}`
          const opening = yield* postJson(
            "/v1/chat/completions",
            chat("open", { routing: { session_id: sessionId } }),
            { "x-credit-key": key.secret }
          )
          assert.strictEqual(opening.status, 200, opening.text)
          const token = opening.headers.get("x-session-token")!
          const turn = (content: string) =>
            postJson("/v1/chat/completions", chat(content, { routing: { session_id: sessionId } }), {
              "x-session-token": token
            })

          yield* withReceiptsLocked((unlock) =>
            Effect.gen(function* () {
              const first = yield* Effect.forkChild(turn("first turn"))
              yield* Effect.sleep("1 second")
              assert.isUndefined(first.pollUnsafe(), "a turn's reply waits for its settlement")
              yield* unlock
              const answered = yield* Fiber.join(first)
              assert.strictEqual(answered.status, 200, answered.text)
              // Its settlement is committed: the next turn takes the session at once.
              assert.strictEqual(yield* statusOf(answered.headers.get("x-request-id")!), "captured")
              const next = yield* turn("second turn")
              assert.strictEqual(next.status, 200, next.text)
            })
          )
        })
    )
  })
})
