import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Duration, Effect } from "effect"
import { SqlClient } from "effect/sql"
import { LiveStreams } from "../../src/inference/LiveStreams.ts"
import { Drain } from "../../src/process/Drain.ts"
import { drainInFlight } from "../../src/Shutdown.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, RouterUrl, routerWithFleet } from "../support/Router.ts"

const chat = (key: string, maxTokens: number) => ({
  method: "POST",
  headers: { "content-type": "application/json", "x-credit-key": key },
  body: JSON.stringify({
    model: "auto",
    stream: true,
    max_tokens: maxTokens,
    messages: [{ role: "user", content: "go long [[sim:long]]" }]
  })
})

describe("the drain deadline", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect(
      "work still running at the deadline is interrupted: each stream ends and each request is billed",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const base = yield* RouterUrl
          const live = yield* LiveStreams
          const drain = yield* Drain
          const { secret } = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
          const streams = yield* Effect.forEach(
            Array.from({ length: 6 }),
            () =>
              Effect.promise(async () => {
                const response = await fetch(`${base}/v1/chat/completions`, chat(secret, 4000))
                return {
                  status: response.status,
                  id: response.headers.get("x-request-id")!,
                  body: response.text()
                }
              }),
            { concurrency: "unbounded" }
          )
          for (const stream of streams) assert.strictEqual(stream.status, 200)
          assert.strictEqual(yield* live.running, 6)

          // No second signal: the one-second deadline does it.
          yield* drainInFlight(Duration.seconds(1), Deferred.makeUnsafe<NodeJS.Signals>())
          assert.strictEqual(yield* live.running, 0)
          assert.strictEqual(yield* drain.inFlight, 0)

          for (const stream of streams) {
            const body = yield* Effect.promise(() => stream.body)
            assert.isTrue(body.trimEnd().endsWith("data: [DONE]"), body.slice(-300))
            assert.include(body, '"code":"stopped"')
          }
          const sql = yield* SqlClient.SqlClient
          const receipts = yield* sql<{ status: string; charged: number }>`
          SELECT body->>'status' AS status, (body->>'charged')::int AS charged FROM receipts
          WHERE request_id IN ${sql.in(streams.map((s) => s.id))}
        `
          assert.strictEqual(receipts.length, 6)
          for (const receipt of receipts) {
            assert.strictEqual(receipt.status, "partial")
            assert.isAbove(receipt.charged, 0)
          }

          // Draining: new paid work is refused, the rest is served.
          const refused = yield* call("/v1/chat/completions", chat(secret, 10))
          assert.strictEqual(refused.status, 503)
          assert.strictEqual(refused.headers.get("retry-after"), "5")
          assert.strictEqual((refused.json as { error: { code: string } }).error.code, "draining")
          assert.strictEqual((yield* call(`/v1/receipts/${streams[0]!.id}`)).status, 200)
          const ready = yield* call("/ready")
          assert.strictEqual(ready.status, 503)
          assert.strictEqual((ready.json as { status: string }).status, "draining")
        })
    )
  })
})
