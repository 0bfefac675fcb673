import { assert, describe, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Exit, Fiber } from "effect"
import { vi } from "vitest"
import { within } from "../../src/process/Within.ts"

describe("within (a bound of one fiber and one timer)", () => {
  it.live("answers what finishes in time, its success or its failure", () =>
    Effect.gen(function* () {
      assert.strictEqual(yield* within(Effect.succeed(7), 1_000), 7)
      assert.strictEqual(yield* within(Effect.as(Effect.sleep("5 millis"), 8), 1_000), 8)
      const failed = yield* Effect.exit(within(Effect.fail("no" as const), 1_000))
      assert.deepStrictEqual(failed, Exit.fail("no" as const))
    })
  )

  it.live("past the bound: a TimeoutError, and the work is interrupted and its finalizer has run", () =>
    Effect.gen(function* () {
      let finalized = false
      const exit = yield* Effect.exit(
        within(Effect.never.pipe(Effect.ensuring(Effect.sync(() => (finalized = true)))), 20)
      )
      assert.isTrue(Exit.isFailure(exit))
      if (Exit.isFailure(exit)) {
        const error = Cause.findErrorOption(exit.cause)
        assert.isTrue(error._tag === "Some" && Cause.isTimeoutError(error.value))
      }
      assert.isTrue(finalized)
    })
  )

  it.live("holds inside an uninterruptible region (a settlement's), as Effect.timeout does", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.uninterruptible(Effect.exit(within(Effect.never, 20)))
      assert.isTrue(Exit.isFailure(exit))
    })
  )

  it.live("its timer is cleared on every exit: the work's end, its failure, the caller's interruption", () =>
    Effect.gen(function* () {
      // Only this bound's timers (an unusual length), whatever else arms timers meanwhile.
      const BOUND = 987_654
      const armed = new Set<unknown>()
      const set = vi.spyOn(globalThis, "setTimeout")
      const clear = vi.spyOn(globalThis, "clearTimeout")
      try {
        const live = () => {
          set.mock.calls.forEach((call, i) => {
            if (call[1] === BOUND) armed.add(set.mock.results[i]!.value)
          })
          for (const [handle] of clear.mock.calls) armed.delete(handle)
          return armed.size
        }
        yield* within(Effect.sleep("2 millis"), BOUND)
        assert.strictEqual(live(), 0, "ended in time")
        yield* Effect.exit(within(Effect.fail("no"), BOUND))
        assert.strictEqual(live(), 0, "failed in time")
        const started = yield* Deferred.make<void>()
        const caller = yield* Effect.forkChild(
          within(Effect.andThen(Deferred.succeed(started, undefined), Effect.never), BOUND)
        )
        yield* Deferred.await(started)
        // The work starts before the timer is armed (`startImmediately`): let the caller reach it.
        yield* Effect.sleep("10 millis")
        assert.strictEqual(live(), 1, "armed while the work runs")
        yield* Fiber.interrupt(caller)
        assert.strictEqual(live(), 0, "the caller interrupted")
      } finally {
        set.mockRestore()
        clear.mockRestore()
      }
    })
  )

  it.live("an interrupted caller interrupts the work", () =>
    Effect.gen(function* () {
      const started = yield* Deferred.make<void>()
      const released = yield* Deferred.make<void>()
      const caller = yield* Effect.forkChild(
        within(
          Deferred.succeed(started, undefined).pipe(
            Effect.andThen(Effect.never),
            Effect.ensuring(Deferred.succeed(released, undefined))
          ),
          10_000
        )
      )
      yield* Deferred.await(started)
      yield* Fiber.interrupt(caller)
      assert.isTrue(yield* Deferred.isDone(released))
    })
  )
})
