import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { quoteSigningString } from "../../src/domain/Quote.ts"
import { call, OPERATOR_TOKEN, postJson, routerLayer } from "../support/Router.ts"

const admin = { authorization: `Bearer ${OPERATOR_TOKEN}` }
const providerKey = privateKeyToAccount(generatePrivateKey())
const strangerKey = privateKeyToAccount(generatePrivateKey())
let counter = 0

const draft = (overrides: Record<string, unknown> = {}) => ({
  quote_id: `q-${Date.now()}-${counter++}`,
  provider_id: "prov-test",
  model_class: "chat-medium",
  price_in: 700_000,
  price_out: 2_800_000,
  max_context: 128_000,
  valid_until: Math.floor(Date.now() / 1000) + 25,
  capacity_rps: 4,
  ...overrides
})

const signed = (
  quote: Record<string, unknown>,
  signer = providerKey
): Effect.Effect<Record<string, unknown>> =>
  Effect.promise(async () => ({
    ...quote,
    sig: await signer.signMessage({ message: quoteSigningString(quote as never) })
  }))

const quoteCount = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM quotes`
  return rows[0]!.n
})

type OpenAiError = { error: { code: string; param: string | null } }

describe("quote ingest", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("registers a provider and accepts its signed quote into the anonymized book", () =>
      Effect.gen(function* () {
        const reg = yield* postJson(
          "/v1/admin/providers",
          {
            provider_id: "prov-test",
            signer: providerKey.address,
            base_url: "http://127.0.0.1:9",
            dialect: "openai"
          },
          admin
        )
        assert.strictEqual(reg.status, 200)
        const quote = yield* signed(draft())
        const r = yield* postJson("/provider/quotes", quote)
        assert.strictEqual(r.status, 200, r.text)
        const book = yield* call("/v1/market/book")
        assert.notInclude(book.text, "prov-test")
        const medium = (
          book.json as { classes: Array<{ model_class: string; levels: Array<{ price_in: number }> }> }
        ).classes.find((c) => c.model_class === "chat-medium")!
        assert.deepStrictEqual(
          medium.levels.map((l) => l.price_in),
          [700_000]
        )
        // Re-posting the identical quote is idempotent.
        assert.strictEqual((yield* postJson("/provider/quotes", quote)).status, 200)
      })
    )

    it.effect("rejects every bad quote with a clear error and stores nothing", () =>
      Effect.gen(function* () {
        const before = yield* quoteCount
        const nowS = Math.floor(Date.now() / 1000)
        const reused = yield* signed(draft())
        assert.strictEqual((yield* postJson("/provider/quotes", reused)).status, 200)
        const afterGood = yield* quoteCount
        const cases: Array<[string, unknown, number, string | undefined]> = [
          [
            "unknown provider",
            yield* signed(draft({ provider_id: "nobody" })),
            403,
            "provider_not_registered"
          ],
          ["another key", yield* signed(draft(), strangerKey), 401, "invalid_signature"],
          ["expired", yield* signed(draft({ valid_until: nowS - 30 })), 400, "quote_expired"],
          ["too long", yield* signed(draft({ valid_until: nowS + 120 })), 400, "quote_ttl_too_long"],
          ["unknown class", yield* signed(draft({ model_class: "gpt-9" })), 400, "unknown_model_class"],
          ["fractional price", yield* signed(draft({ price_in: 1.5 })), 400, undefined],
          ["negative price", yield* signed(draft({ price_out: -1 })), 400, undefined],
          [
            "reused id",
            yield* signed(
              draft({ quote_id: (reused as unknown as { quote_id: string }).quote_id, price_in: 1 })
            ),
            409,
            "quote_id_reused"
          ]
        ]
        for (const [name, body, status, code] of cases) {
          const r = yield* postJson("/provider/quotes", body)
          assert.strictEqual(r.status, status, `${name}: ${r.text}`)
          if (code !== undefined) assert.strictEqual((r.json as OpenAiError).error.code, code, name)
        }
        assert.strictEqual(afterGood, before + 1)
        assert.strictEqual(yield* quoteCount, afterGood)
      })
    )

    it.effect("disabling a provider takes its quotes out of the market at once", () =>
      Effect.gen(function* () {
        const r = yield* postJson("/provider/quotes", yield* signed(draft({ price_in: 650_000 })))
        assert.strictEqual(r.status, 200)
        const depth = (json: unknown) =>
          (json as { classes: Array<{ model_class: string; depth: number }> }).classes.find(
            (c) => c.model_class === "chat-medium"
          )!.depth
        assert.strictEqual(depth((yield* call("/v1/market/book")).json), 1)
        const off = yield* call("/v1/admin/providers/prov-test/disable", { method: "POST", headers: admin })
        assert.strictEqual(off.status, 200)
        assert.strictEqual(depth((yield* call("/v1/market/book")).json), 0)
        const refused = yield* postJson("/provider/quotes", yield* signed(draft()))
        assert.strictEqual((refused.json as OpenAiError).error.code, "provider_disabled")
        const preview = yield* postJson("/v1/routing/preview", {
          model: "chat-medium",
          messages: [{ role: "user", content: "hi" }]
        })
        const profiles = (preview.json as { profiles: Array<{ outcome: string }> }).profiles
        assert.isTrue(profiles.every((p) => p.outcome === "no_eligible_quote"))
        yield* call("/v1/admin/providers/prov-test/enable", { method: "POST", headers: admin })
      })
    )
  })
})
