import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../../src/chain/Chain.ts"
import { handSignedHeader, payer, providerRequests, waitForBook } from "../support/Pay.ts"
import { postJson, type Reply, routerWithFleet } from "../support/Router.ts"

/**
 * An x402 call's signature is checked once (D380): with an `Idempotency-Key` the check made for the key's
 * scope goes on with the call and the payment verifier takes its answer; without one the verifier checks.
 * Either way a signature that is not the payer's is a 402 in the caller's dialect with nothing reserved,
 * served or moved. A nonce seen before is refused by the reservation's own statement (D381).
 */

const prompt = [{ role: "user", content: "hello" }]
const surfaces = [
  {
    dialect: "openai",
    path: "/v1/chat/completions",
    body: { model: "chat-medium", messages: prompt, max_tokens: 32 }
  },
  {
    dialect: "anthropic",
    path: "/v1/messages",
    body: { model: "chat-medium", messages: prompt, max_tokens: 32 }
  },
  {
    dialect: "responses",
    path: "/v1/responses",
    body: { model: "chat-medium", input: "hello", max_output_tokens: 32 }
  }
] as const

interface Body402 {
  readonly x402Version: number
  readonly code?: string
  readonly error?: string
  readonly accepts: ReadonlyArray<{ readonly payTo: string }>
}

const counts = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [row] = yield* sql<{ requests: number; authorizations: number; ledger: number; keys: number }>`
    SELECT (SELECT count(*)::int FROM requests) AS requests,
           (SELECT count(*)::int FROM x402_authorizations) AS authorizations,
           (SELECT count(*)::int FROM ledger_entries) AS ledger,
           (SELECT count(*)::int FROM idempotency_keys) AS keys
  `
  return { ...row!, providers: yield* providerRequests }
}).pipe(Effect.orDie)

const assertRefused = (reply: Reply, what: string, error: RegExp) => {
  assert.strictEqual(reply.status, 402, `${what}: ${reply.text.slice(0, 200)}`)
  assert.isNotNull(reply.headers.get("payment-required"), what)
  const body = reply.json as Body402
  assert.strictEqual(body.x402Version, 2, what)
  assert.strictEqual(body.code, "payment_invalid", what)
  assert.match(body.error ?? "", error, what)
  assert.isAbove(body.accepts.length, 0, `${what}: fresh accepts to sign again`)
}

describe("an x402 call's signature, checked once", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect(
      "a forged or tampered signature is a 402 in every dialect, with or without Idempotency-Key: nothing reserved, served or moved",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const chain = yield* Chain
          const { account: victim } = yield* payer(2)
          const { account: thief } = yield* payer(3)
          const balances = Effect.all([
            chain.balanceOf(victim.address),
            chain.balanceOf(thief.address),
            chain.balanceOf(chain.treasury)
          ])
          const balancesBefore = yield* balances
          const before = yield* counts

          for (const surface of surfaces) {
            for (const idempotent of [false, true]) {
              const keyed = (name: string): Record<string, string> =>
                idempotent ? { "idempotency-key": `${name}-${surface.dialect}` } : {}
              const what = `${surface.dialect}${idempotent ? " with Idempotency-Key" : ""}`
              // Signed by the thief in the victim's name.
              const forged = yield* handSignedHeader(victim, { value: 5_000_000n, signer: thief })
              assertRefused(
                yield* postJson(surface.path, surface.body, {
                  "payment-signature": forged,
                  ...keyed("forged")
                }),
                `forged, ${what}`,
                /signature/
              )
              // The victim's own signature over 5 USDC, sent as 6.
              const tampered = yield* handSignedHeader(victim, { value: 5_000_000n, sentValue: 6_000_000n })
              assertRefused(
                yield* postJson(surface.path, surface.body, {
                  "payment-signature": tampered,
                  ...keyed("tampered")
                }),
                `tampered, ${what}`,
                /signature/
              )
            }
          }

          // No request, authorization, ledger row or idempotency key; no provider called; no money moved.
          assert.deepStrictEqual(yield* counts, before)
          assert.deepStrictEqual(yield* balances, balancesBefore)

          // The same calls signed by the payer are served, the idempotent ones on the check they carry.
          for (const surface of surfaces) {
            for (const idempotent of [false, true]) {
              const signed = yield* handSignedHeader(victim, { value: 5_000_000n })
              const reply = yield* postJson(surface.path, surface.body, {
                "payment-signature": signed,
                ...(idempotent ? { "idempotency-key": `genuine-${surface.dialect}` } : {})
              })
              assert.strictEqual(reply.status, 200, `${surface.dialect}: ${reply.text.slice(0, 200)}`)
            }
          }
          const after = yield* counts
          assert.strictEqual(after.requests - before.requests, 6)
          assert.strictEqual(after.authorizations - before.authorizations, 6)
          assert.strictEqual(after.keys - before.keys, 3)
        })
    )

    it.effect(
      "a nonce seen before is refused by the reservation: twice at once or again later, one request served",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const { account } = yield* payer(6)
          const header = yield* handSignedHeader(account, { value: 1_000_000n })
          const before = yield* counts
          const send = postJson("/v1/chat/completions", surfaces[0].body, { "payment-signature": header })
          const replies = yield* Effect.all([send, send], { concurrency: 2 })
          assert.sameMembers(
            replies.map((r) => r.status),
            [200, 402]
          )
          assertRefused(replies.find((r) => r.status === 402)!, "the twin", /already used/)
          assertRefused(yield* send, "the replay", /already used/)
          // Another surface, another dialect: the same nonce is still the payer's one authorization.
          assertRefused(
            yield* postJson("/v1/messages", surfaces[1].body, {
              "payment-signature": header,
              "idempotency-key": "replayed-elsewhere"
            }),
            "the replay on /v1/messages",
            /already used/
          )
          const after = yield* counts
          assert.strictEqual(after.requests - before.requests, 1)
          assert.strictEqual(after.authorizations - before.authorizations, 1)
          assert.strictEqual(after.providers - before.providers, 1)
          const sql = yield* SqlClient.SqlClient
          const rows = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM x402_authorizations WHERE payer = ${account.address.toLowerCase()}
          `.pipe(Effect.orDie)
          assert.strictEqual(rows[0]!.n, 1)
        })
    )
  })
})
