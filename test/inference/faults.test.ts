import { assert, describe, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import {
  handSignedHeader,
  payer,
  providerRequests,
  readSse,
  receiptWhen,
  waitFor,
  waitForBook
} from "../support/Pay.ts"
import { call, postJson, RouterUrl, routerWithFleet } from "../support/Router.ts"
import { startStopwatch } from "../support/Stopwatch.ts"

type OpenAiError = { error: { code: string; type: string; message: string } }
type Body402 = {
  x402Version: number
  code?: string
  accepts: Array<{ amount: string; maxAmountRequired: string }>
}

const chat = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "chat-medium",
  messages: [{ role: "user", content }],
  max_tokens: 64,
  ...extra
})

const paidPost = (body: unknown, headers: Record<string, string> = {}, wallet = 1) =>
  Effect.gen(function* () {
    const { payingFetch } = yield* payer(wallet)
    const base = yield* RouterUrl
    return yield* Effect.promise(() =>
      payingFetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify(body)
      })
    )
  })

describe("paid completions: rejections, idempotency, faults, cancellation, resume", () => {
  layer(routerWithFleet({ epochSeconds: 3600 }), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("every rejection moves no money and starts no provider work", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { chain, account } = yield* payer(1)
        const balance = yield* chain.balanceOf(account.address)
        const seen = yield* providerRequests

        const unpaid = yield* postJson("/v1/chat/completions", chat("hello"))
        assert.strictEqual(unpaid.status, 402)
        const body = unpaid.json as Body402
        assert.strictEqual(body.x402Version, 2)
        assert.strictEqual(body.accepts[0]!.amount, body.accepts[0]!.maxAmountRequired)
        const header = JSON.parse(
          Buffer.from(unpaid.headers.get("payment-required")!, "base64").toString()
        ) as Body402
        assert.deepStrictEqual(header.accepts, body.accepts)

        const under = yield* handSignedHeader(account, { value: 1n })
        const underpaid = yield* postJson("/v1/chat/completions", chat("hello"), {
          "payment-signature": under
        })
        assert.strictEqual(underpaid.status, 402)
        assert.include(["payment_invalid", "solo_settle_floor"], (underpaid.json as Body402).code)

        const deferred = yield* handSignedHeader(account, { value: 10_000_000n, scheme: "deferred" })
        const wrongScheme = yield* postJson("/v1/chat/completions", chat("hello"), {
          "payment-signature": deferred
        })
        assert.strictEqual(wrongScheme.status, 402)
        assert.strictEqual((wrongScheme.json as Body402).code, "wrong_scheme")

        const elsewhere = yield* handSignedHeader(account, { value: 10_000_000n, to: account.address })
        const misdirected = yield* postJson("/v1/chat/completions", chat("hello"), {
          "payment-signature": elsewhere
        })
        assert.strictEqual(misdirected.status, 402)

        const gatedContext = yield* postJson(
          "/v1/chat/completions",
          chat("hello", { context: { save: true } })
        )
        assert.strictEqual(gatedContext.status, 403)
        assert.strictEqual((gatedContext.json as OpenAiError).error.code, "feature_gated")
        const hosted = yield* postJson(
          "/v1/chat/completions",
          chat("hello", { tools: [{ type: "computer_use_preview" }] })
        )
        assert.strictEqual(hosted.status, 400)
        assert.strictEqual((hosted.json as OpenAiError).error.code, "unsupported_capability")
        const unknownModel = yield* postJson("/v1/chat/completions", chat("hello", { model: "gpt-nine" }))
        assert.strictEqual(unknownModel.status, 404)

        assert.strictEqual(yield* providerRequests, seen)
        assert.strictEqual(yield* chain.balanceOf(account.address), balance)
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM requests WHERE payer = ${account.address.toLowerCase()}`
        assert.strictEqual(rows[0]!.n, 0)
      })
    )

    it.effect(
      "Idempotency-Key: same key and body replays one result; another body or a duplicate in flight is 409",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = `idem-${Math.random().toString(36).slice(2)}`
          const body = chat("idempotent please")
          const first = yield* paidPost(body, { "idempotency-key": key })
          assert.strictEqual(first.status, 200)
          const firstJson = (yield* Effect.promise(() => first.json())) as { svc: { request_id: string } }
          const seen = yield* providerRequests
          const again = yield* paidPost(body, { "idempotency-key": key })
          assert.strictEqual(again.status, 200)
          const againJson = (yield* Effect.promise(() => again.json())) as { svc: { request_id: string } }
          assert.strictEqual(againJson.svc.request_id, firstJson.svc.request_id)
          assert.strictEqual(again.headers.get("x-request-id"), first.headers.get("x-request-id"))
          assert.strictEqual(yield* providerRequests, seen)
          const sql = yield* SqlClient.SqlClient
          const rows = yield* sql<{
            n: number
          }>`SELECT count(*)::int AS n FROM requests WHERE request_id = ${firstJson.svc.request_id}`
          assert.strictEqual(rows[0]!.n, 1)
          const other = yield* paidPost(chat("a different body"), { "idempotency-key": key })
          assert.strictEqual(other.status, 409)
          // The key is the caller's own: another wallet with the same key and body is served afresh
          // and never sees the first caller's reply.
          const stranger = yield* paidPost(body, { "idempotency-key": key }, 4)
          assert.strictEqual(stranger.status, 200)
          assert.notStrictEqual(stranger.headers.get("x-request-id"), first.headers.get("x-request-id"))

          // Two at once under a fresh key: one is served, the other is told to wait for it.
          const raceKey = `race-${Math.random().toString(36).slice(2)}`
          const [a, b] = yield* Effect.all(
            [paidPost(body, { "idempotency-key": raceKey }), paidPost(body, { "idempotency-key": raceKey })],
            {
              concurrency: 2
            }
          )
          assert.sameMembers([a.status, b.status].sort(), [200, 409])
        })
    )

    it.effect(
      "one balance never pays for two requests: concurrent authorizations beyond it are refused",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const { chain, account } = yield* payer(7)
          const balance = yield* chain.balanceOf(account.address)
          const value = (balance * 6n) / 10n
          const headers = yield* Effect.all([
            handSignedHeader(account, { value }),
            handSignedHeader(account, { value })
          ])
          const replies = yield* Effect.all(
            headers.map((h) =>
              postJson("/v1/chat/completions", chat("spend it all"), { "payment-signature": h })
            ),
            { concurrency: 2 }
          )
          assert.sameMembers(
            replies.map((r) => r.status),
            [200, 402]
          )
          const refused = replies.find((r) => r.status === 402)!
          assert.strictEqual((refused.json as Body402).code, "payment_invalid")
        })
    )

    it.effect("a provider failing before the first token hands over to the next quote, once", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const preview = yield* postJson("/v1/routing/preview", chat("fallback"))
        const winner = (
          preview.json as { profiles: Array<{ profile: string; winner: { provider: string } }> }
        ).profiles.find((p) => p.profile === "as-sent")!.winner.provider
        const r = yield* paidPost(chat(`fallback [[sim:error@${winner}]]`))
        assert.strictEqual(r.status, 200)
        const requestId = r.headers.get("x-request-id")!
        const receipt = yield* receiptWhen(requestId)
        assert.notStrictEqual(receipt.receipt.provider_id, winner)
        assert.strictEqual(receipt.receipt.status, "ok")
      })
    )

    it.effect(
      "when every provider fails before the first token: a clear 502, the reservation released in full",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          // A wallet with no other activity in this file, so no earlier settlement can land meanwhile.
          const { chain, account } = yield* payer(5)
          const balance = yield* chain.balanceOf(account.address)
          const r = yield* paidPost(chat("everyone fails [[sim:error]]"), {}, 5)
          assert.strictEqual(r.status, 502)
          const error = (yield* Effect.promise(() => r.json())) as OpenAiError
          assert.match(error.error.message, /nothing was charged/)
          const sql = yield* SqlClient.SqlClient
          const rows = yield* sql<{ status: string; charged: number }>`
          SELECT status, charged::int FROM requests WHERE payer = ${account.address.toLowerCase()} ORDER BY created_at DESC LIMIT 1`
          assert.deepStrictEqual(rows[0], { status: "released", charged: 0 })
          yield* Effect.sleep("1 second")
          assert.strictEqual(yield* chain.balanceOf(account.address), balance)
        })
    )

    it.effect(
      "an error after the first token ends the stream with an error event; only delivered tokens are charged",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const r = yield* paidPost(chat("drop me [[sim:drop]]", { stream: true, max_tokens: 200 }))
          assert.strictEqual(r.status, 200)
          const { text } = yield* readSse(r)
          assert.match(text, /"error":\{/)
          assert.match(text, /data: \[DONE\]/)
          const receipt = yield* receiptWhen(r.headers.get("x-request-id")!)
          assert.strictEqual(receipt.receipt.status, "partial")
          assert.isAbove(receipt.receipt.charged, 0)
          assert.isBelow(receipt.receipt.charged, receipt.receipt.authorized)
          assert.isAtMost(receipt.receipt.out_tokens, 5)
        })
    )

    it.effect(
      "a client hanging up mid-stream aborts the upstream within a second and pays only for what was delivered",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const fleet = yield* Fleet
          const abortedBefore = yield* Effect.forEach(fleet.providers, (p) =>
            Effect.map(p.counters, (c) => c.streamsAborted)
          )
          const controller = new AbortController()
          const { payingFetch } = yield* payer(1)
          const base = yield* RouterUrl
          const r = yield* Effect.promise(() =>
            payingFetch(`${base}/v1/chat/completions`, {
              method: "POST",
              headers: { "content-type": "application/json" },
              body: JSON.stringify(chat("go long [[sim:long]]", { stream: true, max_tokens: 3000 })),
              signal: controller.signal
            })
          )
          const requestId = r.headers.get("x-request-id")!
          yield* readSse(r, 6)
          // A second on an idle machine; stretched by the slowdown the load caused meanwhile
          // (test/support/Stopwatch.ts), so a loaded machine cannot fail it.
          const sinceHangUp = startStopwatch()
          controller.abort()
          yield* waitFor(
            "the upstream abort",
            Effect.map(
              Effect.forEach(fleet.providers, (p) => Effect.map(p.counters, (c) => c.streamsAborted)),
              (now) => (now.some((n, i) => n > abortedBefore[i]!) ? true : undefined)
            ),
            5_000
          )
          assert.isBelow(sinceHangUp.elapsedMs(), 1_500 * sinceHangUp.stretch())
          const receipt = yield* receiptWhen(requestId)
          assert.strictEqual(receipt.receipt.status, "partial")
          assert.isAbove(receipt.receipt.out_tokens, 0)
          assert.isBelow(receipt.receipt.out_tokens, 3000)
          assert.isBelow(receipt.receipt.charged, receipt.receipt.authorized)
        })
    )

    it.effect(
      "GET /v1/streams/:id replays from the last event id; POST /v1/streams/:id/stop cancels open work",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const done = yield* paidPost(chat("replay me", { stream: true }))
          const token = done.headers.get("x-stream-token")!
          const id = done.headers.get("x-request-id")!
          const original = yield* readSse(done)
          const ids = [...original.text.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]))
          assert.isAbove(ids.length, 3)
          const resumed = yield* call(`/v1/streams/${id}`, {
            headers: { "x-stream-token": token, "last-event-id": "2" }
          })
          assert.strictEqual(resumed.status, 200)
          const resumedIds = [...resumed.text.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]))
          assert.deepStrictEqual(
            resumedIds,
            ids.filter((i) => i > 2)
          )
          assert.match(resumed.text, /data: \[DONE\]/)
          assert.notMatch(resumed.text, /auction_cleared/)
          const stranger = yield* call(`/v1/streams/${id}`, { headers: { "x-stream-token": "nope" } })
          assert.strictEqual(stranger.status, 401)

          const long = yield* paidPost(chat("stop me [[sim:long]]", { stream: true, max_tokens: 3000 }))
          const longId = long.headers.get("x-request-id")!
          const reading = yield* Effect.forkChild(readSse(long))
          yield* Effect.sleep("300 millis")
          const stopped = yield* call(`/v1/streams/${longId}/stop`, {
            method: "POST",
            headers: { "x-stream-token": long.headers.get("x-stream-token")! }
          })
          assert.strictEqual(stopped.status, 200)
          const { text } = yield* Fiber.join(reading)
          assert.match(text, /data: \[DONE\]/)
          const receipt = yield* receiptWhen(longId)
          assert.strictEqual(receipt.receipt.status, "partial")
          assert.isBelow(receipt.receipt.out_tokens, 3000)
        })
    )
  })
})
