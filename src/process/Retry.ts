import { Effect, type Schedule } from "effect"

/** What the paid path's retries say: a schedule of plain delays, a `while` on the error, a number of retries. */
export interface RetryOptions<E> {
  readonly schedule?: Schedule.Schedule<unknown, E, never, never>
  readonly while?: (error: E) => boolean
  readonly times?: number
}

/**
 * `Effect.retry(self, options)`, with its schedule made only once the first attempt has failed. The paid path
 * retries statements that nearly always succeed the first time (a settlement, a reservation), and
 * `Effect.retry` builds its schedule, its step and a service for each attempt before the first one: about 3 µs
 * and 2.5 KB a call for nothing (D571). Attempts, delays, what `while` sees and the error it ends with are
 * `Effect.retry`'s own: the retry starts from the first attempt's error, replayed as its first attempt, and
 * `Effect.catch` takes the same errors `Effect.retry` retries (typed failures; a cause with a defect in it is
 * neither caught nor retried).
 */
export const retryAfterFailure =
  <E>(options: RetryOptions<E>) =>
  <A, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.catch(self, (first) => {
      let replayed = false
      const attempt = Effect.suspend(() => {
        if (replayed) return self
        replayed = true
        return Effect.fail(first)
      })
      return Effect.retry(attempt, options)
    })
