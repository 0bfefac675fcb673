import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"
import { startStopwatch } from "../support/Stopwatch.ts"

type Book = {
  classes: Array<{
    model_class: string
    depth: number
    levels: Array<{ price_in: number; price_out: number }>
  }>
}

// From the start of this file: the router and its fleet start in this process, before the first test.
// The 15 s are promised for an idle machine; the bound grows with the slowdown this thread saw meanwhile
// (test/support/Stopwatch.ts), so a loaded machine cannot fail it and an idle one checks it in full.
const stopwatch = startStopwatch()
const PROMISED_MS = 15_000

describe("the market with the simulated fleet", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("the fleet's quotes are in the book within 15 s of start, with no provider named", () =>
      Effect.gen(function* () {
        let book: Book = { classes: [] }
        const polling = startStopwatch()
        while (polling.elapsedMs() < 45_000) {
          book = (yield* call("/v1/market/book")).json as Book
          if (book.classes.length > 0 && book.classes.every((c) => c.depth > 0)) break
          yield* Effect.sleep("100 millis")
        }
        const elapsed = stopwatch.elapsedMs()
        const stretch = stopwatch.stretch()
        assert.isBelow(
          elapsed,
          PROMISED_MS * stretch,
          `the load stretched this process ${stretch.toFixed(2)}x`
        )
        assert.deepStrictEqual(book.classes.map((c) => c.model_class).sort(), [
          "chat-large",
          "chat-medium",
          "chat-small",
          "grounded-medium",
          "image-standard",
          "reasoning-large"
        ])
        for (const c of book.classes) assert.isAbove(c.depth, 0, c.model_class)
        const text = (yield* call("/v1/market/book")).text
        assert.notMatch(text, /sim-|provider|0x[0-9a-fA-F]{40}/)
      })
    )

    it.effect("GET /v1/models is an OpenAI list with live depth, best ask, quality and profiles", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const r = yield* call("/v1/models")
        const body = r.json as {
          object: string
          data: Array<{
            id: string
            object: string
            live_depth: number
            best_ask: unknown
            quality: unknown
            routing_profiles: string[]
          }>
        }
        assert.strictEqual(body.object, "list")
        const medium = body.data.find((m) => m.id === "chat-medium")!
        assert.strictEqual(medium.object, "model")
        assert.isAbove(medium.live_depth, 1)
        assert.isNotNull(medium.best_ask)
        assert.strictEqual(medium.quality, 0.75)
        assert.includeMembers(medium.routing_profiles, ["auto", "cheapest"])
        assert.includeMembers(
          body.data.map((m) => m.id),
          ["auto", "best", "cheapest", "fastest"]
        )
      })
    )

    it.effect("POST /v1/routing/preview names winners under six profiles without calling a provider", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const r = yield* postJson("/v1/routing/preview", {
          model: "chat-medium",
          messages: [{ role: "user", content: "Summarise the second-score auction in one line." }],
          max_tokens: 300,
          routing: { latency_slo: { metric: "first_token", deadline_ms: 5_000, confidence: 0.9 } }
        })
        assert.strictEqual(r.status, 200, r.text)
        const body = r.json as {
          prompt_tokens: number
          profiles: Array<{
            profile: string
            outcome: string
            mechanism_version: string
            winner: {
              provider: string
              clear: { price_in: number }
              own_ask: { price_in: number }
              price_setter: string
            } | null
            candidates: { considered: number; eligible: number }
            data_maturity: Record<string, number>
          }>
        }
        assert.isAbove(body.prompt_tokens, 5)
        assert.deepStrictEqual(
          body.profiles.map((p) => p.profile),
          ["auto", "best", "cheapest", "fastest", "as-sent", "as-sent-without-latency-slo"]
        )
        for (const p of body.profiles) {
          assert.strictEqual(p.outcome, "cleared", p.profile)
          assert.isAtLeast(p.winner!.clear.price_in, p.winner!.own_ask.price_in)
          assert.isAbove(p.candidates.eligible, 0)
          assert.isAbove(
            Object.values(p.data_maturity).reduce((a, b) => a + b, 0),
            0
          )
        }
        const asSent = body.profiles.find((p) => p.profile === "as-sent")!
        assert.strictEqual(asSent.mechanism_version, "deadline-price/1")
        const cheapest = body.profiles.find((p) => p.profile === "cheapest")!
        assert.strictEqual(cheapest.winner!.price_setter, "runner-up")
      })
    )
  })
})
