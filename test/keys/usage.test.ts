import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { payer, waitFor, waitForBook } from "../support/Pay.ts"
import { call, postJson, RouterUrl, routerWithFleet } from "../support/Router.ts"
import { type BalanceView, balanceWith, createKey, invite } from "./support.ts"

interface UsageRow {
  readonly id: string
  readonly requests: number
  readonly spent: number
  readonly reserved: number
  readonly remaining: number
  readonly budget: number
}

describe("usage counters of a funded key", () => {
  layer(routerWithFleet(), { timeout: 120_000, excludeTestServices: true })((it) => {
    it.effect("completions paid by x-credit-key show up as requests and spend in /v1/keys/usage", () =>
      Effect.gen(function* () {
        const { account, payingFetch } = yield* payer(5)
        const base = yield* RouterUrl
        yield* invite(account.address)
        const spender = yield* createKey(account, { label: "agent", budget_usdc: "1", spend: true })
        const reader = yield* createKey(account, { label: "dashboard", budget_usdc: "0" })
        const deposit = yield* Effect.promise(() =>
          payingFetch(`${base}/v1/credits/deposits`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ amount_usdc: "2" })
          })
        )
        assert.strictEqual(deposit.status, 202)
        yield* waitFor(
          "the deposit",
          Effect.map(balanceWith(spender.key), (r) =>
            (r.json as BalanceView).available === 2_000_000 ? true : undefined
          )
        )
        yield* waitForBook

        for (let i = 0; i < 2; i++) {
          const reply = yield* postJson(
            "/v1/chat/completions",
            { model: "auto", max_tokens: 32, messages: [{ role: "user", content: `hello ${i}` }] },
            { "x-credit-key": spender.key }
          )
          assert.strictEqual(reply.status, 200, reply.text)
        }
        const usage = yield* waitFor(
          "captured spend",
          Effect.map(call("/v1/keys/usage", { headers: { "x-api-key": reader.key } }), (r) => {
            const row = (r.json as { data: ReadonlyArray<UsageRow> }).data.find((k) => k.id === spender.id)
            return row !== undefined && row.reserved === 0 && row.spent > 0 ? row : undefined
          })
        )
        assert.strictEqual(usage.requests, 2)
        assert.strictEqual(usage.remaining, usage.budget - usage.spent)
        const balance = (yield* balanceWith(spender.key)).json as BalanceView
        assert.strictEqual(
          balance.available,
          2_000_000 - usage.spent,
          "the balance paid exactly what the key spent"
        )
        const readerRow = (
          (yield* call("/v1/keys/usage", { headers: { "x-api-key": reader.key } })).json as {
            data: ReadonlyArray<UsageRow>
          }
        ).data.find((k) => k.id === reader.id)
        assert.deepInclude(readerRow, { requests: 0, spent: 0 })
      })
    )
  })
})
