import { Effect, type Exit, Scope } from "effect"

/**
 * A scoped resource as `Effect.acquireRelease` makes one, without what it keeps for the release: the
 * acquisition effect and the context the acquisition ran in (D465). `acquire` runs uninterruptibly and
 * `release(a, exit)` is added to the current scope in the same step, so a resource acquired is always
 * released, on success, failure and interruption; the release runs in the context of the fiber that
 * closes the scope. For resources held as long as a reply streams, where that is memory per stream.
 */
export const acquireReleaseLean = <A, E, R>(
  acquire: Effect.Effect<A, E, R>,
  release: (a: A, exit: Exit.Exit<unknown, unknown>) => Effect.Effect<unknown>
): Effect.Effect<A, E, R | Scope.Scope> =>
  Effect.uninterruptible(
    Effect.flatMap(Effect.scope, (scope) =>
      Effect.flatMap(acquire, (a) => Effect.as(Scope.addFinalizerExit(scope, releaseOf(release, a)), a))
    )
  )

/** Made apart, so that the finalizer closes over the release and the resource only. */
const releaseOf =
  <A>(release: (a: A, exit: Exit.Exit<unknown, unknown>) => Effect.Effect<unknown>, a: A) =>
  (exit: Exit.Exit<unknown, unknown>) =>
    release(a, exit)
