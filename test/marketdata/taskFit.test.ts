import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { qualityShift, ratedQuality, TASK_FIT_MAX_SHIFT } from "../../src/market/TaskFit.ts"
import { TaskFitBoard } from "../../src/marketdata/TaskFitBoard.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"

describe("the task-fit rule (D232), hand-computed", () => {
  it("ratings map 1..5 onto quality 0..1", () => {
    assert.strictEqual(ratedQuality(1), 0)
    assert.strictEqual(ratedQuality(3), 0.5)
    assert.strictEqual(ratedQuality(5), 1)
  })

  it("below 5 ratings nothing moves; then n / (n + 10) of the gap, at most 0.25 either way", () => {
    assert.strictEqual(qualityShift(0.55, undefined), 0)
    assert.strictEqual(qualityShift(0.55, { ratings: 4, mean: 5 }), 0)
    // 10 ratings weigh 10/20: half of (1 - 0.55).
    assert.strictEqual(qualityShift(0.55, { ratings: 10, mean: 5 }), 0.225)
    // 5 ratings of mean 4 (quality 0.75) against 0.9: 5/15 × -0.15 = -0.05.
    assert.strictEqual(qualityShift(0.9, { ratings: 5, mean: 4 }), -0.05)
    // 30 ratings weigh 0.75: 0.75 × 0.45 = 0.3375, clamped to 0.25.
    assert.strictEqual(qualityShift(0.55, { ratings: 30, mean: 5 }), TASK_FIT_MAX_SHIFT)
    assert.strictEqual(qualityShift(0.9, { ratings: 40, mean: 1 }), -TASK_FIT_MAX_SHIFT)
    // 40 ratings of 5 against 0.95: 0.8 × 0.05 = 0.04.
    assert.strictEqual(qualityShift(0.95, { ratings: 40, mean: 5 }), 0.04)
    // 1,000 ratings of 1 against 0.1: 1,000/1,010 × -0.1 = -0.0990099…, never below 0.
    assert.strictEqual(qualityShift(0.1, { ratings: 1_000, mean: 1 }), -0.09901)
  })
})

const TASK = "contract-review"

interface PreviewBody {
  task: string | null
  profiles: Array<{
    profile: string
    winner: {
      model: string
      score_breakdown: {
        quality: number
        task_fit?: {
          task: string
          ratings: number
          mean: number | null
          catalog_quality: number
          quality_shift: number
        }
      }
    } | null
  }>
}

/** `count` served requests of a class, each rated `rating` for the task (as `POST /v1/routing/feedback` stores them). */
const seedRatings = (modelClass: string, count: number, rating: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const prefix = `fit_${modelClass}_${rating}_`
    yield* sql.unsafe(
      `INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class, provider_id,
                             authorized, charged, status, created_at, finished_at)
       SELECT $1 || g, 'chat', 'credit', '0x${"0".repeat(40)}', 'best', $2, 'sim-seeded', 1000, 100, 'captured', now(), now()
       FROM generate_series(1, $3::int) g`,
      [prefix, modelClass, count]
    )
    yield* sql.unsafe(
      `INSERT INTO market_feedback (request_id, model_class, provider_id, task, rating)
       SELECT $1 || g, $2, 'sim-seeded', $4, $5 FROM generate_series(1, $3::int) g`,
      [prefix, modelClass, count, TASK, rating]
    )
  }).pipe(Effect.orDie)

const request = (routing: Record<string, unknown>) => ({
  model: "best",
  messages: [{ role: "user", content: "Does clause 7 cap the supplier's liability?" }],
  max_tokens: 64,
  routing
})

describe("routing.task with the simulated fleet", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect(
      "seeded ratings move `best` off chat-large for the task, in the preview and in the paid routing",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          // chat-large (0.9) rated poor for the task, reasoning-large (0.95) rated excellent: with the task,
          // chat-large scores 0.65 and leaves best's band (within 0.05 of 0.99).
          yield* seedRatings("chat-large", 40, 1)
          yield* seedRatings("reasoning-large", 40, 5)
          yield* (yield* TaskFitBoard).reload

          const plain = yield* postJson("/v1/routing/preview", request({}))
          assert.strictEqual(plain.status, 200, plain.text)
          const plainBody = plain.json as PreviewBody
          assert.strictEqual(plainBody.task, null)
          const plainBest = plainBody.profiles.find((p) => p.profile === "as-sent")!
          assert.strictEqual(plainBest.winner!.model, "chat-large")
          assert.isUndefined(plainBest.winner!.score_breakdown.task_fit)

          const tasked = yield* postJson("/v1/routing/preview", request({ task: TASK }))
          assert.strictEqual(tasked.status, 200, tasked.text)
          const body = tasked.json as PreviewBody
          assert.strictEqual(body.task, TASK)
          const best = body.profiles.find((p) => p.profile === "as-sent")!
          assert.strictEqual(best.winner!.model, "reasoning-large")
          assert.deepStrictEqual(best.winner!.score_breakdown.task_fit, {
            task: TASK,
            ratings: 40,
            mean: 5,
            catalog_quality: 0.95,
            quality_shift: 0.04
          })
          assert.strictEqual(best.winner!.score_breakdown.quality, 0.99)
          const without = body.profiles.find((p) => p.profile === "as-sent-without-task")!
          assert.strictEqual(without.winner!.model, "chat-large")

          const key = yield* fundedKey({ budget: 50_000_000, balance: 50_000_000 })
          const paid = (routing: Record<string, unknown>) =>
            postJson("/v1/chat/completions", request(routing), { "x-credit-key": key.secret })
          const paidPlain = yield* paid({})
          assert.strictEqual(paidPlain.status, 200, paidPlain.text)
          assert.strictEqual(paidPlain.headers.get("x-routing-model"), "chat-large")
          const paidTasked = yield* paid({ task: TASK })
          assert.strictEqual(paidTasked.status, 200, paidTasked.text)
          assert.strictEqual(paidTasked.headers.get("x-routing-model"), "reasoning-large")

          // The evidence routing used is what /v1/analytics/task-fit shows.
          const fits = (yield* call("/v1/analytics/task-fit")).json as {
            fits: Array<{ model_class: string; task: string; ratings: number; mean: number }>
          }
          assert.deepStrictEqual(
            fits.fits.filter((f) => f.task === TASK),
            [
              { model_class: "chat-large", task: TASK, ratings: 40, mean: 1 },
              { model_class: "reasoning-large", task: TASK, ratings: 40, mean: 5 }
            ]
          )
        })
    )

    it.effect("a bad routing.task is a 400 in the caller's dialect, and nothing is reserved or charged", () =>
      Effect.gen(function* () {
        const key = yield* fundedKey({ budget: 50_000_000, balance: 50_000_000 })
        const before = yield* keyState(key.keyId)
        const headers = { "x-credit-key": key.secret }
        for (const task of ["", " leading-space", "x".repeat(65), "line\nbreak", 7]) {
          const chat = yield* postJson("/v1/chat/completions", request({ task }), headers)
          assert.strictEqual(chat.status, 400, chat.text)
          assert.strictEqual((chat.json as { error: { type: string } }).error.type, "invalid_request_error")
          assert.include(chat.text, "routing")

          const messages = yield* postJson(
            "/v1/messages",
            {
              model: "best",
              max_tokens: 64,
              messages: [{ role: "user", content: "Hello" }],
              routing: { task }
            },
            headers
          )
          assert.strictEqual(messages.status, 400, messages.text)
          const anthropic = messages.json as { type: string; error: { type: string } }
          assert.strictEqual(anthropic.type, "error")
          assert.strictEqual(anthropic.error.type, "invalid_request_error")

          const responses = yield* postJson(
            "/v1/responses",
            { model: "best", input: "Hello", max_output_tokens: 64, routing: { task } },
            headers
          )
          assert.strictEqual(responses.status, 400, responses.text)
          assert.strictEqual(
            (responses.json as { error: { type: string } }).error.type,
            "invalid_request_error"
          )

          const preview = yield* postJson("/v1/routing/preview", request({ task }))
          assert.strictEqual(preview.status, 400, preview.text)
        }
        assert.deepStrictEqual(yield* keyState(key.keyId), before)
      })
    )
  })
})
