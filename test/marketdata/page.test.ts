import { mkdirSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { openPage, TestBrowser } from "../support/Browser.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitFor, waitForBook } from "../support/Pay.ts"
import { call, postJson, RouterUrl, routerWithFleet } from "../support/Router.ts"

const ARTIFACTS = join(import.meta.dirname, "..", "..", "test-artifacts")

/** A paid chat completion with a funded key; its request id and stream token. */
const paidRequest = Effect.gen(function* () {
  const key = yield* fundedKey({ budget: 50_000_000, balance: 50_000_000 })
  const reply = yield* postJson(
    "/v1/chat/completions",
    {
      model: "chat-small",
      messages: [{ role: "user", content: "Describe a candle chart." }],
      max_tokens: 32
    },
    { "x-credit-key": key.secret }
  )
  assert.strictEqual(reply.status, 200, reply.text)
  return { requestId: reply.headers.get("x-request-id")!, streamToken: reply.headers.get("x-stream-token")! }
})

describe("the live market page in headless Chromium", () => {
  layer(Layer.merge(routerWithFleet(), TestBrowser.layer), { timeout: 240_000, excludeTestServices: true })(
    (it) => {
      it.effect(
        "shows every class of the book, a paid request on the tape and in the candles live, and polls on a 503",
        () =>
          Effect.scoped(
            Effect.gen(function* () {
              yield* waitForBook
              const base = yield* RouterUrl
              const errors: Array<string> = []
              const page = yield* openPage(async (page) => {
                page.on("console", (m) => {
                  if (m.type() === "error") errors.push(m.text())
                })
                page.on("pageerror", (e) => errors.push(String(e)))
              })
              yield* Effect.promise(() => page.goto(`${base}/market`))
              yield* Effect.promise(() =>
                page.waitForSelector('#status[data-mode="live"]', { timeout: 30_000 })
              )
              const book = (yield* call("/v1/market/book")).json as {
                classes: Array<{ model_class: string; depth: number }>
              }
              for (const c of book.classes.filter((c) => c.depth > 0)) {
                yield* Effect.promise(() =>
                  page.waitForSelector(`section[data-class="${c.model_class}"] tbody tr`, { timeout: 30_000 })
                )
              }
              const paid = yield* paidRequest
              yield* Effect.promise(() =>
                page.waitForSelector(`#tape tr[data-request-id="${paid.requestId}"]`, { timeout: 30_000 })
              )
              yield* Effect.promise(() =>
                // A selector, not a predicate: the page's CSP refuses the eval Playwright polls a string with.
                page.waitForSelector(
                  'section[data-class="chat-small"][data-candle-count]:not([data-candle-count="0"]):not([data-candle-count=""])',
                  { timeout: 30_000 }
                )
              )
              const row = yield* Effect.promise(() =>
                page.textContent(`#tape tr[data-request-id="${paid.requestId}"]`)
              )
              assert.include(row, "chat-small")
              mkdirSync(ARTIFACTS, { recursive: true })
              yield* Effect.promise(() =>
                page.screenshot({ path: join(ARTIFACTS, "market-page.png"), fullPage: true })
              )
              yield* Effect.promise(() => page.setViewportSize({ width: 390, height: 844 }))
              const overflow = yield* Effect.promise(() =>
                page.evaluate<number>(
                  "document.documentElement.scrollWidth - document.documentElement.clientWidth"
                )
              )
              assert.isAtMost(overflow, 0, "nothing is wider than a phone's screen")
              yield* Effect.promise(() =>
                page.screenshot({ path: join(ARTIFACTS, "market-page-phone.png"), fullPage: true })
              )
              // The same router refusing the events (its 503 at capacity): the page polls the snapshot instead.
              // (A second page of this context: the single-process Chromium ends with its last context.)
              const polled = yield* Effect.acquireRelease(
                Effect.promise(() => page.context().newPage()),
                (p) => Effect.promise(() => p.close())
              )
              polled.on("pageerror", (e) => errors.push(String(e)))
              yield* Effect.promise(() =>
                polled.route("**/v1/market/events", (route) =>
                  route.fulfill({
                    status: 503,
                    headers: { "retry-after": "10", "content-type": "application/json" },
                    body: JSON.stringify({
                      error: {
                        message: "poll GET /v1/market/snapshot",
                        type: "service_unavailable",
                        code: "subscriber_capacity",
                        param: null
                      }
                    })
                  })
                )
              )
              yield* Effect.promise(() => polled.goto(`${base}/market`))
              yield* Effect.promise(() =>
                polled.waitForSelector('#status[data-mode="polling"]', { timeout: 30_000 })
              )
              const later = yield* paidRequest
              yield* Effect.promise(() =>
                polled.waitForSelector(`#tape tr[data-request-id="${later.requestId}"]`, { timeout: 30_000 })
              )
              assert.deepStrictEqual(errors, [])
            })
          )
      )

      it.effect("a rating needs the request's stream token, counts once and shows in task-fit", () =>
        Effect.gen(function* () {
          const paid = yield* paidRequest
          const rate = (id: string, token: string, body: unknown) =>
            postJson(`/v1/routing/feedback/${id}`, body, { "x-stream-token": token })
          assert.strictEqual((yield* rate(paid.requestId, "not-the-token", { rating: 5 })).status, 401)
          assert.strictEqual((yield* rate("req_unknown", paid.streamToken, { rating: 5 })).status, 404)
          assert.strictEqual((yield* rate(paid.requestId, paid.streamToken, { rating: 9 })).status, 400)
          const first = yield* rate(paid.requestId, paid.streamToken, { rating: 4, task: "summarize" })
          assert.strictEqual(first.status, 200, first.text)
          assert.deepInclude(first.json as object, {
            request_id: paid.requestId,
            rating: 4,
            task: "summarize"
          })
          const second = yield* rate(paid.requestId, paid.streamToken, { rating: 1, task: "summarize" })
          assert.strictEqual(second.status, 409)
          assert.include(second.text, "feedback_already_recorded")
          const fit = yield* waitFor(
            "the rating in task-fit",
            Effect.map(call("/v1/analytics/task-fit"), (r) =>
              (r.json as { fits: Array<{ task: string; ratings: number; mean: number }> }).fits.find(
                (f) => f.task === "summarize"
              )
            )
          )
          assert.deepInclude(fit, { ratings: 1, mean: 4 })
        })
      )
    }
  )
})
