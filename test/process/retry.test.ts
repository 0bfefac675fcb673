import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Fiber, Schedule } from "effect"
import { TestClock } from "effect/testing"
import { type RetryOptions, retryAfterFailure } from "../../src/process/Retry.ts"

class Flaky {
  readonly _tag = "Flaky"
  readonly attempt: number
  constructor(attempt: number) {
    this.attempt = attempt
  }
}
class Fatal {
  readonly _tag = "Fatal"
}

/**
 * An effect that fails its first `failures` attempts (a `Fatal` at attempt `fatalAt`, a defect at `dieAt`),
 * recording when each attempt ran (from the start); then the exit of `retried(effect)` after 10 s of test time, and the times.
 */
const run = (
  retried: (self: Effect.Effect<string, Flaky | Fatal>) => Effect.Effect<string, Flaky | Fatal>,
  failures: number,
  fatalAt = -1,
  dieAt = -1
) =>
  Effect.gen(function* () {
    const times: Array<number> = []
    const started = yield* Clock.currentTimeMillis
    const effect = Effect.gen(function* () {
      const attempt = times.length
      times.push((yield* Clock.currentTimeMillis) - started)
      if (attempt === dieAt) return yield* Effect.die("broken")
      if (attempt === fatalAt) return yield* Effect.fail(new Fatal())
      if (attempt < failures) return yield* Effect.fail(new Flaky(attempt))
      return `ok after ${attempt}`
    })
    const fiber = yield* Effect.forkChild(retried(effect))
    yield* TestClock.adjust("10 seconds")
    const exit = yield* Fiber.await(fiber)
    return { exit, times }
  })

const policies: ReadonlyArray<readonly [string, RetryOptions<Flaky | Fatal>]> = [
  ["an exponential schedule, 2 retries", { schedule: Schedule.exponential("50 millis"), times: 2 }],
  ["while the error is Flaky, 3 retries", { while: (error) => error._tag === "Flaky", times: 3 }]
]

describe("retryAfterFailure (Effect.retry, its schedule made only after a failure)", () => {
  for (const [name, options] of policies) {
    it.effect(`attempts, their times and the exit are Effect.retry's: ${name}`, () =>
      Effect.gen(function* () {
        for (const [failures, fatalAt, dieAt] of [
          [0, -1, -1],
          [1, -1, -1],
          [2, -1, -1],
          [3, -1, -1],
          [5, -1, -1],
          [5, 1, -1],
          [5, -1, 1],
          [5, -1, 0]
        ] as const) {
          const theirs = yield* run((self) => Effect.retry(self, options), failures, fatalAt, dieAt)
          const ours = yield* run(retryAfterFailure(options), failures, fatalAt, dieAt)
          const label = `${failures} failures, fatal at ${fatalAt}, defect at ${dieAt}`
          assert.deepStrictEqual(ours.times, theirs.times, label)
          assert.deepStrictEqual(ours.exit, theirs.exit, label)
        }
      })
    )
  }

  it.effect("a first attempt that succeeds is the only one, and its value is answered", () =>
    Effect.gen(function* () {
      const { exit, times } = yield* run(retryAfterFailure({ times: 3 }), 0)
      assert.deepStrictEqual(exit, Exit.succeed("ok after 0"))
      assert.strictEqual(times.length, 1)
    })
  )
})
