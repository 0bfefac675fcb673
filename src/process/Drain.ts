import { Context, Deferred, Effect, Layer } from "effect"

/**
 * Whether this instance still admits paid work, and how much admitted work is still in its handlers.
 * Shutdown (src/Shutdown.ts) flips it to draining; the HTTP gate (src/http/DrainGate.ts) then answers
 * new paid work 503 with `Retry-After`, and `/ready` answers 503 `draining`, so a load balancer moves
 * new traffic to another instance while what was admitted here finishes.
 */
export class Drain extends Context.Service<
  Drain,
  {
    readonly isDraining: () => boolean
    readonly begin: Effect.Effect<void>
    /** Waits until the drain begins: what holds a connection open without paid work ends it then. */
    readonly whenDraining: Effect.Effect<void>
    /** Runs admitted paid work, counted in `inFlight` until its handler returns. */
    readonly track: <A, E, R>(work: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
    readonly inFlight: Effect.Effect<number>
  }
>()("router/process/Drain") {
  static readonly layer = Layer.sync(Drain, () => {
    let draining = false
    let inFlight = 0
    const began = Deferred.makeUnsafe<void>()
    return Drain.of({
      isDraining: () => draining,
      begin: Effect.sync(() => {
        draining = true
        Deferred.doneUnsafe(began, Effect.void)
      }),
      whenDraining: Deferred.await(began),
      track: (work) =>
        Effect.acquireUseRelease(
          Effect.sync(() => {
            inFlight++
          }),
          () => work,
          () =>
            Effect.sync(() => {
              inFlight--
            })
        ),
      inFlight: Effect.sync(() => inFlight)
    })
  })
}
