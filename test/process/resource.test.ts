import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import { acquireReleaseLean } from "../../src/process/Resource.ts"

// D465: a resource acquired is released exactly once with the scope's exit, whatever ends it; the
// acquisition is not cut half-way by an interruption.
describe("acquireReleaseLean", () => {
  it.effect("releases with the scope's exit on success, failure and interruption", () =>
    Effect.gen(function* () {
      const released: Array<string> = []
      const resource = (name: string) =>
        acquireReleaseLean(Effect.succeed(name), (a, exit) =>
          Effect.sync(() => released.push(`${a}:${Exit.isSuccess(exit) ? "ok" : "failed"}`))
        )
      yield* Effect.scoped(resource("a"))
      yield* Effect.exit(Effect.scoped(Effect.andThen(resource("b"), Effect.fail("boom"))))
      const started = yield* Deferred.make<void>()
      const fiber = yield* Effect.scoped(
        Effect.andThen(resource("c"), Effect.andThen(Deferred.succeed(started, undefined), Effect.never))
      ).pipe(Effect.forkChild)
      yield* Deferred.await(started)
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(released, ["a:ok", "b:failed", "c:failed"])
    })
  )

  it.effect("an acquisition interrupted while it runs completes and is released", () =>
    Effect.gen(function* () {
      const released: Array<string> = []
      const scope = yield* Scope.make()
      const inAcquire = yield* Deferred.make<void>()
      const proceed = yield* Deferred.make<void>()
      const acquire = Effect.andThen(Deferred.succeed(inAcquire, undefined), Deferred.await(proceed)).pipe(
        Effect.as("held")
      )
      const fiber = yield* acquireReleaseLean(acquire, (a) => Effect.sync(() => released.push(a))).pipe(
        Scope.provide(scope),
        Effect.forkChild
      )
      yield* Deferred.await(inAcquire)
      const interrupting = yield* Fiber.interrupt(fiber).pipe(Effect.forkChild)
      yield* Deferred.succeed(proceed, undefined)
      yield* Fiber.join(interrupting)
      assert.deepStrictEqual(released, [])
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(released, ["held"])
    })
  )
})
