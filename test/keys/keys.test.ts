import { createHash } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { call, postJson, routerLayer } from "../support/Router.ts"
import { balanceWith, createKey, errorCode, invite, keysHeaders, signedCall } from "./support.ts"

const wallets = Effect.gen(function* () {
  const chain = yield* Chain
  const [a, b] = [0, 1].map((i) => privateKeyToAccount(chain.demoWallets[i]!.privateKey!))
  return { a: a!, b: b! }
})

interface KeyListing {
  readonly wallet: string
  readonly data: ReadonlyArray<
    Record<string, unknown> & { id: string; kind: string; revoked_at: number | null }
  >
}

describe("wallet-signed key management", () => {
  layer(routerLayer(), { timeout: 120_000, excludeTestServices: true })((it) => {
    it.effect("a signed request is accepted once; the same headers again are 401", () =>
      Effect.gen(function* () {
        const { a } = yield* wallets
        const headers = yield* keysHeaders(a, "GET", "/v1/keys", "")
        const first = yield* call("/v1/keys", { headers })
        assert.strictEqual(first.status, 200, first.text)
        assert.strictEqual((first.json as KeyListing).wallet, a.address.toLowerCase())
        const again = yield* call("/v1/keys", { headers })
        assert.strictEqual(again.status, 401)
        assert.strictEqual(errorCode(again.json), "invalid_wallet_signature")
        assert.strictEqual((again.json as { error: { type: string } }).error.type, "authentication_error")
      })
    )

    it.effect("expired (301 s old), early (301 s ahead), tampered, another wallet, unsigned: 401", () =>
      Effect.gen(function* () {
        const { a, b } = yield* wallets
        // Rounded away from the router's clock, which moves on while the request travels; each read just
        // before its own call: the clock moving on only ages an old one further, but brings an early one
        // inside the window (read once for both, a loaded machine took over a second to reach the second).
        const body = { label: "x", budget_usdc: "1" }
        const replies = [
          yield* signedCall(a, "GET", "/v1/keys", undefined, {
            timestamp: Math.floor(Date.now() / 1000) - 301
          }),
          yield* signedCall(a, "GET", "/v1/keys", undefined, {
            timestamp: Math.ceil(Date.now() / 1000) + 301
          }),
          yield* signedCall(a, "POST", "/v1/keys", body, {
            signedBody: JSON.stringify({ label: "x", budget_usdc: "0.01" })
          }),
          yield* signedCall(a, "POST", "/v1/keys", body, { claimedWallet: b.address }),
          yield* call("/v1/keys"),
          yield* postJson("/v1/keys", body)
        ]
        for (const reply of replies) {
          assert.strictEqual(reply.status, 401, reply.text)
          assert.strictEqual(errorCode(reply.json), "invalid_wallet_signature")
        }
        // A path signed for one endpoint does not open another.
        const headers = yield* keysHeaders(a, "GET", "/v1/keys", "")
        const moved = yield* call("/v1/keys/key_nope", { method: "DELETE", headers })
        assert.strictEqual(moved.status, 401)
        const sql = yield* SqlClient.SqlClient
        const stored = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM api_keys`
        assert.strictEqual(stored[0]!.n, 0, "no refused request created a key")
      })
    )

    it.effect(
      "invited + spend → credit key; else api key; not invited + spend → 403; only hashes stored",
      () =>
        Effect.gen(function* () {
          const { a, b } = yield* wallets
          const sql = yield* SqlClient.SqlClient
          const unauthorizedAdmin = yield* postJson("/v1/admin/wallets", { wallet: a.address, invited: true })
          assert.strictEqual(unauthorizedAdmin.status, 401)
          const invited = yield* invite(a.address)
          assert.strictEqual(invited.status, 200, invited.text)
          assert.deepStrictEqual(invited.json, { wallet: a.address.toLowerCase(), invited: true })

          const credit = yield* createKey(a, { label: "agent-1", budget_usdc: "2.5", spend: true })
          assert.strictEqual(credit.kind, "credit")
          assert.match(credit.key, /^svc_ck_/)
          assert.strictEqual(credit.budget, 2_500_000)
          assert.strictEqual(credit.budget_usdc, "2.500000")
          const api = yield* createKey(a, { label: "dashboard", budget_usdc: "0" })
          assert.strictEqual(api.kind, "api")
          assert.match(api.key, /^svc_ak_/)

          const refused = yield* signedCall(b, "POST", "/v1/keys", {
            label: "b",
            budget_usdc: "1",
            spend: true
          })
          assert.strictEqual(refused.status, 403, refused.text)
          assert.strictEqual(errorCode(refused.json), "wallet_not_invited")
          const bApi = yield* createKey(b, { label: "b-read", budget_usdc: "1" })
          assert.strictEqual(bApi.kind, "api")

          const rows = yield* sql<{ key_id: string; key_hash: string; wallet: string }>`
          SELECT key_id, key_hash, wallet FROM api_keys ORDER BY created_at`
          assert.strictEqual(rows.length, 3)
          const sha = (s: string) => createHash("sha256").update(s).digest("hex")
          assert.strictEqual(rows.find((r) => r.key_id === credit.id)?.key_hash, sha(credit.key))
          const dump = JSON.stringify(yield* sql`SELECT row_to_json(k)::text AS row FROM api_keys k`)
          for (const secret of [credit.key, api.key, bApi.key]) assert.notInclude(dump, secret)

          // Spend-capable surface: the credit key reads the balance, the api key cannot spend.
          const balance = yield* balanceWith(credit.key)
          assert.strictEqual(balance.status, 200, balance.text)
          assert.strictEqual((balance.json as { available: number }).available, 0)
          const readOnly = yield* balanceWith(api.key)
          assert.strictEqual(readOnly.status, 403)
          assert.strictEqual(errorCode(readOnly.json), "key_cannot_spend")
          const missing = yield* call("/v1/credits/balance")
          assert.strictEqual(missing.status, 401)

          // Listing: the owner's keys only, never a secret.
          const listing = yield* signedCall(a, "GET", "/v1/keys")
          assert.strictEqual(listing.status, 200)
          const data = (listing.json as KeyListing).data
          assert.deepStrictEqual(data.map((k) => k.id).sort(), [credit.id, api.id].sort())
          assert.notInclude(listing.text, credit.key)
          assert.isFalse(data.some((k) => "key" in k))
          assert.deepStrictEqual(
            data.find((k) => k.id === credit.id),
            {
              id: credit.id,
              object: "api_key",
              label: "agent-1",
              kind: "credit",
              budget: 2_500_000,
              budget_usdc: "2.500000",
              spent: 0,
              reserved: 0,
              remaining: 2_500_000,
              requests: 0,
              created_at: data.find((k) => k.id === credit.id)!.created_at,
              revoked_at: null,
              expires_at: null
            }
          )

          // An invite withdrawn closes spending at once, keys untouched.
          yield* invite(a.address, false)
          const uninvited = yield* balanceWith(credit.key)
          assert.strictEqual(uninvited.status, 403)
          assert.strictEqual(errorCode(uninvited.json), "wallet_not_invited")
          yield* invite(a.address, true)
          assert.strictEqual((yield* balanceWith(credit.key)).status, 200)
        })
    )

    it.effect("bad input is 400 after the signature checks", () =>
      Effect.gen(function* () {
        const { a } = yield* wallets
        for (const budget of ["1.1234567", "-1", "abc", "1e6"]) {
          const reply = yield* signedCall(a, "POST", "/v1/keys", { label: "x", budget_usdc: budget })
          assert.strictEqual(reply.status, 400, budget)
          assert.strictEqual(errorCode(reply.json), "invalid_budget")
        }
        const noLabel = yield* signedCall(a, "POST", "/v1/keys", { budget_usdc: "1" })
        assert.strictEqual(noLabel.status, 400)
        const text = "{not json"
        const headers = yield* keysHeaders(a, "POST", "/v1/keys", text)
        const junk = yield* call("/v1/keys", {
          method: "POST",
          headers: { ...headers, "content-type": "application/json" },
          body: text
        })
        assert.strictEqual(junk.status, 400)
      })
    )

    it.effect("revoke: owner only (else 404), effective on the next request", () =>
      Effect.gen(function* () {
        const { a, b } = yield* wallets
        yield* invite(a.address)
        const key = yield* createKey(a, { label: "to-revoke", budget_usdc: "1", spend: true })
        assert.strictEqual((yield* balanceWith(key.key)).status, 200)

        const notOwner = yield* signedCall(b, "DELETE", `/v1/keys/${key.id}`)
        assert.strictEqual(notOwner.status, 404)
        const unknown = yield* signedCall(a, "DELETE", "/v1/keys/key_000000000000000000000000")
        assert.strictEqual(unknown.status, 404)
        assert.strictEqual((yield* balanceWith(key.key)).status, 200, "a refused revoke changes nothing")

        const revoked = yield* signedCall(a, "DELETE", `/v1/keys/${key.id}`)
        assert.strictEqual(revoked.status, 200, revoked.text)
        const revokedAt = (revoked.json as { revoked_at: number | null }).revoked_at
        assert.isNumber(revokedAt)

        const after = yield* balanceWith(key.key)
        assert.strictEqual(after.status, 401)
        assert.strictEqual(errorCode(after.json), "invalid_credit_key")
        const usage = yield* call("/v1/keys/usage", { headers: { "x-credit-key": key.key } })
        assert.strictEqual(usage.status, 401)

        const listing = yield* signedCall(a, "GET", "/v1/keys")
        const listed = (listing.json as KeyListing).data.find((k) => k.id === key.id)
        assert.strictEqual(listed?.revoked_at, revokedAt)
        const twice = yield* signedCall(a, "DELETE", `/v1/keys/${key.id}`)
        assert.strictEqual((twice.json as { revoked_at: number }).revoked_at, revokedAt)
      })
    )

    it.effect("usage: per-key request and spend counters of the caller's wallet, by either key", () =>
      Effect.gen(function* () {
        const { a, b } = yield* wallets
        const sql = yield* SqlClient.SqlClient
        yield* invite(a.address)
        const spender = yield* createKey(a, { label: "usage-spender", budget_usdc: "3", spend: true })
        const reader = yield* createKey(a, { label: "usage-reader", budget_usdc: "0" })
        const other = yield* createKey(b, { label: "usage-other", budget_usdc: "0" })
        // The counters the paid credit-key path keeps (Ledger.reserveCredit / capture).
        yield* sql`UPDATE api_keys SET requests = 7, spent = 12345, reserved = 600 WHERE key_id = ${spender.id}`

        type Usage = {
          wallet: string
          key_id: string
          data: ReadonlyArray<{
            id: string
            requests: number
            spent: number
            reserved: number
            remaining: number
          }>
        }
        const callers: ReadonlyArray<Record<string, string>> = [
          { "x-api-key": reader.key },
          { "x-credit-key": spender.key }
        ]
        for (const headers of callers) {
          const reply = yield* call("/v1/keys/usage", { headers })
          assert.strictEqual(reply.status, 200, reply.text)
          const usage = reply.json as Usage
          assert.strictEqual(usage.wallet, a.address.toLowerCase())
          const row = usage.data.find((k) => k.id === spender.id)
          assert.deepInclude(row, {
            requests: 7,
            spent: 12345,
            reserved: 600,
            remaining: 3_000_000 - 12345 - 600
          })
          assert.isTrue(usage.data.some((k) => k.id === reader.id))
          assert.isFalse(
            usage.data.some((k) => k.id === other.id),
            "another wallet's keys stay private"
          )
          assert.notInclude(reply.text, spender.key)
        }
        const mine = yield* call("/v1/keys/usage", { headers: { "x-api-key": other.key } })
        assert.isTrue((mine.json as Usage).data.some((k) => k.id === other.id))
        assert.isFalse((mine.json as Usage).data.some((k) => k.id === spender.id))
        const unknown = yield* call("/v1/keys/usage", { headers: { "x-api-key": "svc_ak_nope" } })
        assert.strictEqual(unknown.status, 401)
        assert.strictEqual((yield* call("/v1/keys/usage")).status, 401)
      })
    )
  })
})
