import { assert, describe, layer } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { Api } from "../../src/http/Api.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"

/**
 * The success schemas of the API definition (what `/openapi.json` documents) decode what the router
 * really sends. Each reply is decoded with the schemas of its own endpoint, taken from `Api` itself.
 */
const successOf = (group: string, endpoint: string) => {
  const groups = Api.groups as Record<
    string,
    { readonly endpoints: Record<string, { readonly success: Iterable<Schema.Top> }> }
  >
  const schemas = [...groups[group]!.endpoints[endpoint]!.success]
  assert.isAbove(schemas.length, 0, `${group}.${endpoint} declares a success schema`)
  return schemas
}

/** Decodes `body` with one of the endpoint's success schemas, failing the test with the issues otherwise. */
const assertDecodes = (group: string, endpoint: string, body: unknown) => {
  const failures: Array<string> = []
  for (const schema of successOf(group, endpoint)) {
    const result = Schema.decodeUnknownExit(schema as Schema.Codec<unknown, unknown>)(body)
    if (result._tag === "Success") return
    failures.push(String(result.cause))
  }
  assert.fail(`${group}.${endpoint} reply does not decode: ${failures.join("\n")}\n${JSON.stringify(body)}`)
}

const ask = {
  model: "auto",
  messages: [{ role: "user", content: "Explain a second-score auction." }],
  max_tokens: 48
}

describe("success schemas match the replies", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("paid calls in every dialect, their receipts, economics and analytics", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 50_000_000, balance: 50_000_000 })
        const paid = { "x-credit-key": key.secret }

        const chat = yield* postJson("/v1/chat/completions", ask, paid)
        assert.strictEqual(chat.status, 200, chat.text)
        assertDecodes("chat", "chatCompletions", chat.json)
        const requestId = chat.headers.get("x-request-id")!

        const response = yield* postJson(
          "/v1/responses",
          { model: "auto", input: "Say hello.", max_output_tokens: 32 },
          paid
        )
        assert.strictEqual(response.status, 200, response.text)
        assertDecodes("responses", "createResponse", response.json)

        const message = yield* postJson(
          "/v1/messages",
          { model: "auto", max_tokens: 32, messages: [{ role: "user", content: "Hello?" }] },
          paid
        )
        assert.strictEqual(message.status, 200, message.text)
        assertDecodes("messages", "createMessage", message.json)

        const image = yield* postJson("/v1/images/generations", { prompt: "a lighthouse at dawn" }, paid)
        assert.strictEqual(image.status, 200, image.text)
        assertDecodes("images", "generateImage", image.json)

        const receipt = yield* call(`/v1/receipts/${requestId}`)
        assertDecodes("receipts", "receipt", receipt.json)
        const economics = yield* call(`/v1/analytics/requests/${requestId}`)
        assertDecodes("receipts", "economics", economics.json)

        for (const view of ["json", "replay", "tree"]) {
          const auctions = yield* call(`/v1/auctions/latest?view=${view}`, { headers: paid })
          assert.strictEqual(auctions.status, 200, auctions.text)
          assertDecodes("keyAnalytics", "auctionsLatest", auctions.json)
        }
        const tape = yield* call("/v1/auctions/latest?view=tape", { headers: paid })
        assertDecodes("keyAnalytics", "auctionsLatest", tape.text)
        const bestex = yield* call("/v1/keys/bestex", { headers: paid })
        assertDecodes("keyAnalytics", "bestex", bestex.json)
        const balance = yield* call("/v1/credits/balance", { headers: paid })
        assertDecodes("credits", "balance", balance.json)

        const opened = yield* postJson(
          "/v1/chat/completions",
          { ...ask, routing: { session_id: `schemas-${requestId}` } },
          paid
        )
        assert.strictEqual(opened.status, 200, opened.text)
        const session = yield* call(`/v1/analytics/sessions/schemas-${requestId}`)
        assertDecodes("sessions", "sessionTape", session.json)
      })
    )

    it.effect("the market's public reads and the routing preview", () =>
      Effect.gen(function* () {
        yield* waitForBook
        assertDecodes("market", "models", (yield* call("/v1/models")).json)
        assertDecodes("market", "book", (yield* call("/v1/market/book")).json)
        assertDecodes("routing", "preview", (yield* postJson("/v1/routing/preview", ask)).json)
        assertDecodes("system", "health", (yield* call("/health")).json)
      })
    )

    it.effect("points, the integrity program's public reads and an agent setup", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 50_000_000, balance: 50_000_000 })
        const chat = yield* postJson("/v1/chat/completions", ask, { "x-credit-key": key.secret })
        assert.strictEqual(chat.status, 200, chat.text)
        const receipt = (yield* call(`/v1/receipts/${chat.headers.get("x-request-id")}`)).json as {
          readonly receipt: { readonly provider_id: string }
        }

        assertDecodes("points", "leaderboard", (yield* call("/v1/points/leaderboard")).json)
        assertDecodes("points", "account", (yield* call(`/v1/points/${key.wallet}`)).json)
        const provider = yield* call(`/v1/points/provider/${receipt.receipt.provider_id}`)
        assertDecodes("points", "providerPoints", provider.json)
        const challenger = yield* call(`/v1/model-integrity/challengers/${key.wallet}`)
        assertDecodes("integrity", "challenger", challenger.json)

        const started = yield* postJson("/v1/agent-setup/sessions", { harness: "codex", budget_usdc: "1" })
        assert.strictEqual(started.status, 201, started.text)
        assertDecodes("agentSetup", "startSetup", started.json)
        const code = (started.json as { readonly user_code: string }).user_code
        assertDecodes("agentSetup", "viewSetup", (yield* call(`/v1/agent-setup/sessions/${code}`)).json)
      })
    )

    it.effect("/openapi.json gives every JSON success response a schema", () =>
      Effect.gen(function* () {
        const spec = (yield* call("/openapi.json")).json as {
          paths: Record<
            string,
            Record<string, { responses: Record<string, { content?: Record<string, { schema?: object }> }> }>
          >
        }
        const empty: Array<string> = []
        for (const [path, operations] of Object.entries(spec.paths)) {
          for (const [method, operation] of Object.entries(operations)) {
            const ok = operation.responses["200"] ?? operation.responses["201"] ?? operation.responses["202"]
            const schema = ok?.content?.["application/json"]?.schema
            if (schema !== undefined && Object.keys(schema).length === 0) empty.push(`${method} ${path}`)
          }
        }
        assert.deepStrictEqual(empty, [])
      })
    )
  })
})
