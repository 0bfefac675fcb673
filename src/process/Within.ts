import { Cause, Effect, Fiber } from "effect"

/**
 * `self` bounded to `millis`, failing with `Cause.TimeoutError` past it (then `self` is interrupted and
 * waited for), in one fiber and one timer. `Effect.timeout` races `self` against a sleep, each in a fiber
 * of its own: two fibers per call, on paths every paid request takes (D472).
 */
export const within = <A, E, R>(
  self: Effect.Effect<A, E, R>,
  millis: number
): Effect.Effect<A, E | Cause.TimeoutError, R> =>
  Effect.flatMap(Effect.forkChild(self, { startImmediately: true }), (fiber) =>
    Effect.callback<A, E | Cause.TimeoutError>((resume) => {
      const timer = setTimeout(() => {
        stopObserving()
        resume(
          Effect.andThen(
            Fiber.interrupt(fiber),
            Effect.fail(new Cause.TimeoutError(`Operation timed out after ${millis} millis`))
          )
        )
      }, millis)
      const stopObserving = fiber.addObserver((exit) => {
        clearTimeout(timer)
        resume(exit)
      })
      // The caller interrupted while waiting: `self` goes with it.
      return Effect.suspend(() => {
        clearTimeout(timer)
        stopObserving()
        return Fiber.interrupt(fiber)
      })
    })
  )
