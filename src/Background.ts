import { type Duration, Effect, Schedule } from "effect"

/**
 * Runs `pass` again and again, `every` apart, in a fiber of the current layer's scope: a failed
 * pass is logged (as `failure`) and the next one runs; the loop ends with the scope.
 */
export const repeatInBackground = <A, E, R>(
  pass: Effect.Effect<A, E, R>,
  options: { readonly every: Duration.Input; readonly failure: string; readonly level?: "error" | "warning" }
) =>
  pass.pipe(
    Effect.catchCause((cause) =>
      options.level === "warning"
        ? Effect.logWarning(options.failure, cause)
        : Effect.logError(options.failure, cause)
    ),
    Effect.repeat(Schedule.spaced(options.every)),
    Effect.forkScoped
  )
