import { Duration, Effect, Latch, Schedule, type Scope } from "effect"

/**
 * Runs `pass` again and again, `every` apart, in a fiber of the current layer's scope: a failed
 * pass is logged (as `failure`) and the next one runs; the loop ends with the scope.
 */
export const repeatInBackground = <A, E, R>(
  pass: Effect.Effect<A, E, R>,
  options: { readonly every: Duration.Input; readonly failure: string; readonly level?: "error" | "warning" }
) => logged(pass, options).pipe(Effect.repeat(Schedule.spaced(options.every)), Effect.forkScoped)

const logged = <A, E, R>(
  pass: Effect.Effect<A, E, R>,
  options: { readonly failure: string; readonly level?: "error" | "warning" }
) =>
  pass.pipe(
    Effect.catchCause((cause) =>
      options.level === "warning"
        ? Effect.logWarning(options.failure, cause)
        : Effect.logError(options.failure, cause)
    )
  )

/** Wakes a pass made by `passWhenWoken`: work was queued for it. Synchronous, callable from anywhere. */
export type Wake = () => void

/**
 * A background pass that runs only while it has work (D572): while `pending()` says so, `every` apart as
 * `repeatInBackground` runs it; with nothing pending it waits, with no timer, until `wake()` (work was
 * queued) or, with `idleEvery`, until that long has passed (a sweep for work another instance left). A
 * woken pass still waits `every` before it runs, so what is queued meanwhile goes in the same pass: the
 * batches under load are what a pass every `every` makes, and an idle process does not wake for it. The
 * loop runs in a fiber of the current layer's scope and ends with it; a failed pass is logged as `failure`.
 */
export const passWhenWoken = <A, E, R>(
  pass: Effect.Effect<A, E, R>,
  options: {
    readonly every: Duration.Input
    readonly pending: () => boolean
    readonly idleEvery?: Duration.Input | undefined
    readonly failure: string
    readonly level?: "error" | "warning"
  }
): Effect.Effect<Wake, never, R | Scope.Scope> =>
  Effect.gen(function* () {
    // Open: woken since the last pass began. Wakes while a pass waits out `every` are its own (it takes what
    // they queued); one while the pass runs leaves it open, so what was queued after the pass took its batch
    // has a pass of its own.
    const woken = Latch.makeUnsafe(false)
    const every = Duration.fromInputUnsafe(options.every)
    const idle =
      options.idleEvery === undefined
        ? woken.await
        : Effect.asVoid(Effect.timeoutOption(woken.await, options.idleEvery))
    const run = logged(pass, options)
    yield* Effect.forkScoped(
      Effect.forever(
        Effect.suspend(() => (options.pending() ? Effect.void : idle)).pipe(
          Effect.andThen(Effect.sleep(every)),
          Effect.andThen(woken.close),
          Effect.andThen(run)
        )
      )
    )
    return () => {
      woken.openUnsafe()
    }
  })
