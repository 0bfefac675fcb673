import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { payer, readSse, waitForBook } from "../support/Pay.ts"
import { call, RouterUrl, routerWithFleet } from "../support/Router.ts"

describe("stream reconnect works the same in every dialect", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a messages stream resumes after the last event id, in Anthropic's event format", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { payingFetch } = yield* payer(2)
        const base = yield* RouterUrl
        const r = yield* Effect.promise(() =>
          payingFetch(`${base}/v1/messages`, {
            method: "POST",
            headers: { "content-type": "application/json", "anthropic-version": "2023-06-01" },
            body: JSON.stringify({
              model: "chat-medium",
              max_tokens: 48,
              stream: true,
              messages: [{ role: "user", content: "resume me" }]
            })
          })
        )
        assert.strictEqual(r.status, 200)
        const original = yield* readSse(r)
        assert.match(original.text, /event: message_stop/)
        const resumed = yield* call(`/v1/streams/${r.headers.get("x-request-id")}`, {
          headers: { "x-stream-token": r.headers.get("x-stream-token")!, "last-event-id": "3" }
        })
        assert.strictEqual(resumed.status, 200)
        assert.notMatch(resumed.text, /event: message_start/)
        assert.match(resumed.text, /event: message_stop/)
        assert.include(original.text, resumed.text.slice(resumed.text.indexOf("event: message_delta")))
        // The whole replay is the bytes the caller got (D350).
        const replayed = yield* call(`/v1/streams/${r.headers.get("x-request-id")}`, {
          headers: { "x-stream-token": r.headers.get("x-stream-token")! }
        })
        assert.strictEqual(replayed.text, original.text)
        assert.isTrue(original.text.endsWith(resumed.text))
      })
    )
  })
})
