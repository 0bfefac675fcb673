import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { handSignedHeader, payer, waitForBook } from "../support/Pay.ts"
import { call, type Reply, routerWithFleet } from "../support/Router.ts"

/**
 * Launch-gated features answer `feature_gated` (403) before payment or provider work, whatever
 * credentials the request carries: no 402, no reservation, no provider call.
 */

interface OpenAiError {
  readonly error: { code: string; param: string | null; type: string; message: string }
}
interface AnthropicError {
  readonly type: string
  readonly error: { type: string; message: string }
}

const messages = [{ role: "user", content: "hello" }]
const speculative = { speculative: { candidates: 2, hedge_after_ms: 150 } }
const passport = { passport_id: "pp_1", save: true }

/** Every gated request: path, method, body (undefined: none), and the dialect it answers in. */
const cases: ReadonlyArray<{
  readonly name: string
  readonly method: "GET" | "POST" | "DELETE"
  readonly path: string
  readonly body?: unknown
  readonly anthropic?: boolean
}> = [
  { name: "embeddings", method: "POST", path: "/v1/embeddings", body: { model: "auto", input: "x" } },
  { name: "read a passport", method: "GET", path: "/v1/context/passports/pp_1" },
  { name: "delete a passport", method: "DELETE", path: "/v1/context/passports/pp_1" },
  { name: "orders", method: "POST", path: "/v1/orders", body: { model: "auto", max_price: 1 } },
  { name: "read an order", method: "GET", path: "/v1/orders/ord_0123" },
  { name: "cancel an order", method: "POST", path: "/v1/orders/ord_0123/cancel", body: { wallet: "0x00" } },
  { name: "cancel an order without a body", method: "POST", path: "/v1/orders/ord_0123/cancel" },
  {
    name: "challenge quote",
    method: "GET",
    path: "/v1/model-integrity/challenges/quote?receipt_id=req_0123"
  },
  {
    name: "challenge filing",
    method: "POST",
    path: "/v1/model-integrity/challenges",
    body: { receipt_id: "req_0123", signature: "0x00" }
  },
  {
    name: "chat with a passport",
    method: "POST",
    path: "/v1/chat/completions",
    body: { model: "chat-medium", messages, context: passport }
  },
  {
    name: "streamed chat with a passport",
    method: "POST",
    path: "/v1/chat/completions",
    body: { model: "auto", messages, stream: true, context: passport }
  },
  {
    name: "chat with speculative routing",
    method: "POST",
    path: "/v1/chat/completions",
    body: { model: "chat-medium", messages, routing: speculative }
  },
  {
    name: "a session opening with a passport",
    method: "POST",
    path: "/v1/chat/completions",
    body: { model: "chat-medium", messages, context: passport, routing: { session_id: "gated-session" } }
  },
  {
    name: "responses with a passport",
    method: "POST",
    path: "/v1/responses",
    body: { model: "chat-medium", input: "hello", context: passport }
  },
  {
    name: "responses with speculative routing",
    method: "POST",
    path: "/v1/responses",
    body: { model: "chat-medium", input: "hello", stream: true, routing: speculative }
  },
  {
    name: "messages with a passport",
    method: "POST",
    path: "/v1/messages",
    body: { model: "chat-medium", max_tokens: 16, messages, context: passport },
    anthropic: true
  },
  {
    name: "messages with speculative routing",
    method: "POST",
    path: "/v1/messages",
    body: { model: "chat-medium", max_tokens: 16, messages, routing: speculative },
    anthropic: true
  },
  {
    name: "images with a passport",
    method: "POST",
    path: "/v1/images/generations",
    body: { prompt: "a harbor", context: passport }
  },
  {
    name: "images with speculative routing",
    method: "POST",
    path: "/v1/images/generations",
    body: { prompt: "a harbor", routing: speculative }
  }
]

const send = (c: (typeof cases)[number], headers: Record<string, string>) =>
  call(c.path, {
    method: c.method,
    headers: { ...(c.body === undefined ? {} : { "content-type": "application/json" }), ...headers },
    ...(c.body === undefined ? {} : { body: JSON.stringify(c.body) })
  })

const assertGated = (c: (typeof cases)[number], r: Reply, credentials: string) => {
  const what = `${c.name} (${credentials})`
  assert.strictEqual(r.status, 403, `${what}: ${r.text}`)
  assert.isNull(r.headers.get("payment-required"), what)
  assert.isNull(r.headers.get("x-request-id"), what)
  assert.match(r.headers.get("content-type") ?? "", /application\/json/, what)
  if (c.anthropic === true) {
    const body = r.json as AnthropicError
    assert.strictEqual(body.type, "error", what)
    assert.strictEqual(body.error.type, "permission_error", what)
    assert.match(body.error.message, /not enabled at launch/, what)
  } else {
    const body = r.json as OpenAiError
    assert.strictEqual(body.error.code, "feature_gated", what)
    assert.strictEqual(body.error.type, "feature_gated", what)
    assert.isNotNull(body.error.param, what)
  }
}

/** Everything that would show payment or provider work having started. */
const traces = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const fleet = yield* Fleet
  const [requests] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM requests`
  const [authorizations] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM x402_authorizations`
  const [ledger] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM ledger_entries`
  const [sessions] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM sessions`
  const perProvider: Record<string, unknown> = {}
  for (const provider of fleet.providers) {
    const counters = yield* provider.counters
    perProvider[provider.providerId] = {
      requests: counters.requests,
      streams: counters.streamsStarted,
      images: counters.imagesRendered
    }
  }
  return {
    requests: requests!.n,
    authorizations: authorizations!.n,
    ledger: ledger!.n,
    sessions: sessions!.n,
    providers: perProvider
  }
}).pipe(Effect.orDie)

describe("gated and off features fail closed before payment or provider work", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("feature_gated (403) with no credentials, a funded key, or a valid x402 signature", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const chain = yield* Chain
        const { account } = yield* payer(5)
        const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
        const balance = yield* chain.balanceOf(account.address)
        const before = yield* traces
        const keyBefore = yield* keyState(key.keyId)

        for (const c of cases) {
          assertGated(c, yield* send(c, {}), "no credentials")
          assertGated(c, yield* send(c, { "x-credit-key": key.secret }), "funded key")
          const signed = yield* handSignedHeader(account, { value: 5_000_000n })
          assertGated(
            c,
            yield* send(c, { "payment-signature": signed, "idempotency-key": `gated-${c.name}` }),
            "x402 exact"
          )
        }

        // Nothing reserved, recorded, opened or called; no money moved.
        assert.deepStrictEqual(yield* traces, before)
        assert.deepStrictEqual(yield* keyState(key.keyId), keyBefore)
        assert.strictEqual(yield* chain.balanceOf(account.address), balance)
        const sql = yield* SqlClient.SqlClient
        const [idempotency] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM idempotency_keys WHERE key LIKE 'gated-%'`.pipe(Effect.orDie)
        assert.strictEqual(idempotency!.n, 0, "a gated request frees its Idempotency-Key")
      })
    )

    it.effect(
      "the same requests without the gated field are paid calls (the gate, not the route, refused)",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const chat = yield* send(
            {
              name: "chat",
              method: "POST",
              path: "/v1/chat/completions",
              body: { model: "chat-medium", messages }
            },
            {}
          )
          assert.strictEqual(chat.status, 402)
          assert.isNotNull(chat.headers.get("payment-required"))
          const responses = yield* send(
            {
              name: "responses",
              method: "POST",
              path: "/v1/responses",
              body: { model: "chat-medium", input: "hi" }
            },
            {}
          )
          assert.strictEqual(responses.status, 402)
        })
    )
  })
})
