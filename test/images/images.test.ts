import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import { imagePrice } from "../../src/inference/Images.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { handSignedHeader, payer, receiptWhen, waitFor, waitForBook } from "../support/Pay.ts"
import { postJson, RouterUrl } from "../support/Router.ts"
import { decodePng, routerWithImages } from "./support.ts"

interface ImageReply {
  readonly created: number
  readonly data: ReadonlyArray<{ b64_json: string; revised_prompt?: string }>
  readonly svc: {
    readonly request_id: string
    readonly routing: { requested_model: string; selected_model: string }
    readonly auction: {
      readonly mechanism: string
      readonly winner: { provider: string; model: string }
      readonly bids: ReadonlyArray<{ rank: number; provider: string; outcome: string }>
      readonly clear: { price_in: number; price_out: number; unit: string }
    }
    readonly images: number
    readonly charged: number
    readonly authorized: number
    readonly links: { receipt: string }
  }
}
interface Body402 {
  readonly code: string
  readonly accepts: ReadonlyArray<{ scheme: string; amount: string }>
  readonly credits: { required: string }
}
interface OpenAiError {
  readonly error: { code: string; param: string | null; type: string }
}
interface Receipt {
  readonly receipt: {
    readonly status: string
    readonly settlement: string
    readonly charged: number
    readonly authorized: number
    readonly in_tokens: number
    readonly out_tokens: number
    readonly model_class: string
    readonly provider_id: string
    readonly payment_ref: string
    readonly price_in: number
    readonly price_out: number
  }
  readonly final: boolean
}

const rendered = Effect.gen(function* () {
  const fleet = yield* Fleet
  let total = 0
  for (const provider of fleet.providers) total += (yield* provider.counters).imagesRendered
  return total
})

const requestRows = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM requests WHERE dialect = 'images'`
  return rows[0]!.n
}).pipe(Effect.orDie)

const images = (body: unknown, headers: Record<string, string> = {}) =>
  postJson("/v1/images/generations", body, headers)

describe("POST /v1/images/generations", () => {
  layer(routerWithImages(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect(
      "x402 exact: a 402 for exactly the image price, the official client pays, a real PNG, a receipt",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const unpaid = yield* images({ model: "image-standard", prompt: "a lighthouse at dusk" })
          assert.strictEqual(unpaid.status, 402)
          assert.isNotNull(unpaid.headers.get("payment-required"))
          const quoted = unpaid.json as Body402
          assert.deepStrictEqual(
            quoted.accepts.map((a) => a.scheme),
            ["exact"]
          )
          assert.strictEqual(
            quoted.accepts[0]!.amount,
            quoted.credits.required,
            "the price is above the floor"
          )

          const { payingFetch, account } = yield* payer(3)
          const base = yield* RouterUrl
          // The market may move between the 402 and the signed retry: the router then asks again.
          const reply = yield* waitFor(
            "a paid image",
            Effect.promise(async () => {
              const response = await payingFetch(`${base}/v1/images/generations`, {
                method: "POST",
                headers: { "content-type": "application/json" },
                body: JSON.stringify({ model: "image-standard", prompt: "a lighthouse at dusk" })
              })
              return response.status === 200
                ? { body: (await response.json()) as ImageReply, headers: response.headers }
                : undefined
            })
          )
          const { body, headers } = reply
          assert.strictEqual(body.data.length, 1)
          const png = decodePng(Buffer.from(body.data[0]!.b64_json, "base64"))
          assert.strictEqual(png.width, 256)
          assert.strictEqual(png.height, 256)
          assert.strictEqual(body.svc.routing.selected_model, "image-standard")
          assert.strictEqual(body.svc.auction.winner.model, "image-standard")
          assert.strictEqual(body.svc.auction.mechanism, "second-score")
          assert.deepStrictEqual(
            body.svc.auction.bids.map((b) => [b.rank, b.outcome]),
            [
              [1, "won"],
              [2, "lost"]
            ]
          )
          assert.strictEqual(body.svc.auction.bids[1]!.provider, "rival-1")
          assert.strictEqual(body.svc.images, 1)
          assert.strictEqual(body.svc.charged, imagePrice(body.svc.auction.clear))
          assert.isAtLeast(body.svc.authorized, body.svc.charged)
          assert.strictEqual(headers.get("x-request-id"), body.svc.request_id)
          assert.isNotNull(headers.get("payment-response"))
          assert.strictEqual(headers.get("x-routing-model"), "image-standard")

          const receipt = (yield* receiptWhen(
            body.svc.request_id,
            (r) => r.final && r.receipt.settlement === "landed"
          )) as unknown as Receipt
          assert.strictEqual(receipt.receipt.status, "ok")
          assert.strictEqual(receipt.receipt.charged, body.svc.charged)
          assert.strictEqual(receipt.receipt.in_tokens, 1)
          assert.strictEqual(receipt.receipt.out_tokens, 1)
          assert.strictEqual(receipt.receipt.model_class, "image-standard")
          assert.strictEqual(receipt.receipt.price_out, body.svc.auction.clear.price_out)
          assert.strictEqual(receipt.receipt.provider_id, body.svc.auction.winner.provider)
          const sql = yield* SqlClient.SqlClient
          const rows = yield* sql<{ payer: string; status: string; charged: string }>`
          SELECT payer, status, charged::text FROM requests WHERE request_id = ${body.svc.request_id}`
          assert.deepStrictEqual(rows[0], {
            payer: account.address.toLowerCase(),
            status: "captured",
            charged: String(body.svc.charged)
          })
        })
    )

    it.effect("a funded key pays the up-front price from its budget; sizes are honored", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 1_000_000, balance: 2_000_000 })
        const before = yield* rendered
        const r = yield* images(
          { prompt: "a harbor in the fog", size: "512x512" },
          { "x-credit-key": key.secret, "x-routing-agent-role": "worker" }
        )
        assert.strictEqual(r.status, 200, r.text)
        const body = r.json as ImageReply
        assert.strictEqual(body.svc.routing.requested_model, "auto")
        const png = decodePng(Buffer.from(body.data[0]!.b64_json, "base64"))
        assert.strictEqual(png.width, 512)
        assert.strictEqual(body.svc.authorized, body.svc.charged)
        assert.strictEqual(r.headers.get("x-key-budget-remaining"), String(1_000_000 - body.svc.charged))
        assert.strictEqual(r.headers.get("x-routing-agent-role"), "worker")
        assert.strictEqual(yield* rendered, before + 1)
        const state = yield* keyState(key.keyId)
        assert.deepStrictEqual(state, {
          budget: 1_000_000,
          spent: body.svc.charged,
          reserved: 0,
          available: 2_000_000 - body.svc.charged,
          walletReserved: 0
        })
        const receipt = (yield* receiptWhen(body.svc.request_id, (x) => x.final)) as unknown as Receipt
        assert.strictEqual(receipt.receipt.settlement, "landed")
        assert.strictEqual(receipt.receipt.payment_ref, `credit:${key.keyId}`)
        assert.strictEqual(receipt.receipt.charged, body.svc.charged)
      })
    )

    it.effect(
      "upto, sessions and malformed requests are refused before anything is reserved or rendered",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const { account } = yield* payer(4)
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          const poor = yield* fundedKey({ budget: 100, balance: 1_000_000 })
          const rowsBefore = yield* requestRows
          const renderedBefore = yield* rendered
          const prompt = "a quiet meadow"

          const upto = yield* handSignedHeader(account, { value: 1_000_000n, scheme: "upto" })
          const wrongScheme = yield* images({ prompt }, { "payment-signature": upto })
          assert.strictEqual(wrongScheme.status, 402)
          assert.strictEqual((wrongScheme.json as Body402).code, "wrong_scheme")
          assert.deepStrictEqual(
            (wrongScheme.json as Body402).accepts.map((a) => a.scheme),
            ["exact"]
          )

          const bySessionToken = yield* images(
            { prompt },
            { "x-session-token": "tok", "x-credit-key": key.secret }
          )
          assert.strictEqual(bySessionToken.status, 402)
          assert.strictEqual((bySessionToken.json as Body402).code, "wrong_scheme")
          const bySessionId = yield* images(
            { prompt, routing: { session_id: "s-images" } },
            { "x-credit-key": key.secret }
          )
          assert.strictEqual(bySessionId.status, 402)
          assert.strictEqual((bySessionId.json as Body402).code, "wrong_scheme")

          const under = yield* handSignedHeader(account, { value: 10_000n })
          const underpaid = yield* images({ prompt }, { "payment-signature": under })
          assert.strictEqual(underpaid.status, 402)
          assert.strictEqual((underpaid.json as Body402).code, "payment_invalid")

          const overBudget = yield* images({ prompt }, { "x-credit-key": poor.secret })
          assert.strictEqual(overBudget.status, 402)
          assert.strictEqual((overBudget.json as Body402).code, "key_budget_exhausted")

          const refusals: Array<[unknown, number, string, string | null]> = [
            [{ prompt, n: 2 }, 400, "invalid_request", "n"],
            [{ prompt, size: "300x300" }, 400, "invalid_request", "size"],
            [{ prompt, response_format: "url" }, 400, "unsupported_capability", "response_format"],
            [{ prompt, model: "chat-medium" }, 404, "model_not_found", "model"],
            [{ prompt, model: "dall-e-9" }, 404, "model_not_found", "model"],
            [{ prompt: "" }, 400, "invalid_request", null]
          ]
          for (const [body, status, code, param] of refusals) {
            const r = yield* images(body, { "x-credit-key": key.secret })
            assert.strictEqual(r.status, status, JSON.stringify(body))
            assert.strictEqual((r.json as OpenAiError).error.code, code)
            if (param !== null) assert.strictEqual((r.json as OpenAiError).error.param, param)
          }

          assert.strictEqual(yield* requestRows, rowsBefore)
          assert.strictEqual(yield* rendered, renderedBefore)
          const state = yield* keyState(key.keyId)
          assert.strictEqual(state.reserved, 0)
          assert.strictEqual(state.spent, 0)
          assert.strictEqual(state.available, 1_000_000)
        })
    )

    it.effect("a provider failure releases the reservation: 502, nothing charged, a released receipt", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const r = yield* images({ prompt: "a storm [[sim:error]]" }, { "x-credit-key": key.secret })
        assert.strictEqual(r.status, 502)
        assert.strictEqual((r.json as OpenAiError).error.code, "upstream_http_status")
        const state = yield* keyState(key.keyId)
        assert.deepStrictEqual(state, {
          budget: 1_000_000,
          spent: 0,
          reserved: 0,
          available: 1_000_000,
          walletReserved: 0
        })
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ request_id: string; status: string; charged: string }>`
          SELECT request_id, status, charged::text FROM requests WHERE key_id = ${key.keyId}`
        assert.strictEqual(rows.length, 1)
        assert.strictEqual(rows[0]!.status, "released")
        const receipt = (yield* receiptWhen(rows[0]!.request_id)) as unknown as Receipt
        assert.strictEqual(receipt.receipt.status, "released")
        assert.strictEqual(receipt.receipt.charged, 0)
        assert.strictEqual(receipt.receipt.out_tokens, 0)
      })
    )

    it.effect("Idempotency-Key: a replay is a 409 naming the first request, never a second charge", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const headers = { "x-credit-key": key.secret, "idempotency-key": `img-${key.keyId}` }
        const first = yield* images({ prompt: "a copper bridge" }, headers)
        assert.strictEqual(first.status, 200)
        const id = (first.json as ImageReply).svc.request_id
        const again = yield* images({ prompt: "a copper bridge" }, headers)
        assert.strictEqual(again.status, 409)
        assert.strictEqual((again.json as OpenAiError).error.code, "idempotency_replay")
        assert.include(again.text, id)
        const state = yield* keyState(key.keyId)
        assert.strictEqual(state.spent, (first.json as ImageReply).svc.charged)
      })
    )
  })
})
