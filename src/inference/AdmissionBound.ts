import { Context, Duration, Effect, Layer, Metric, Scope, Semaphore } from "effect"
import { ServiceUnavailable } from "../domain/Errors.ts"
import { RouterConfig } from "../RouterConfig.ts"

/**
 * The admission bound (D531): at most `ADMISSION_CONCURRENCY` paid requests are admitted at once (gated,
 * routed, funded and reserved); the rest wait in arrival order, holding nothing but their connection, for
 * at most `ADMISSION_WAIT_SECONDS`, and are then refused with `503 router_busy` and `Retry-After`, nothing
 * charged. Serving (the upstream's stream) is outside the bound: a permit covers the CPU and database work of
 * one admission, not its reply.
 *
 * Without it a burst of paid requests (thousands of streams opened at once) all start admitting together:
 * each waits its turn for one of the ten database connections and one share of the thread, and every other
 * kind of work (a provider's quote refresh, a session's close, the settlement passes) waits behind the whole
 * burst. Under bench:load's 5,000 held streams the providers' quotes expired while their refresh queued, and
 * 1,415 streams were refused `no_eligible_quote`.
 */
export class AdmissionBound extends Context.Service<
  AdmissionBound,
  {
    /**
     * Waits for a permit (interruptible: a caller who hangs up while waiting leaves the queue, having
     * taken nothing) and holds it until `Scope` closes; past the wait bound, `503 router_busy`.
     */
    readonly enter: Effect.Effect<void, ServiceUnavailable, Scope.Scope>
    /** How many wait for a permit now (the `router_admission_waiting` gauge). */
    readonly waiting: Effect.Effect<number>
  }
>()("router/inference/AdmissionBound") {
  static readonly make = (options: { readonly concurrency: number; readonly waitSeconds: number }) =>
    Effect.gen(function* () {
      const permits = yield* Semaphore.make(options.concurrency)
      const waitBound = Duration.seconds(options.waitSeconds)
      const busy = new ServiceUnavailable({
        code: "router_busy",
        message: `The router is admitting ${options.concurrency} paid requests at once and this one waited ${options.waitSeconds} s for its turn; nothing was charged, retry shortly`
      })
      let waitingNow = 0
      const waitingBy = (delta: number) =>
        Effect.suspend(() => {
          waitingNow += delta
          return Metric.update(waiting, waitingNow)
        })
      // In the queue: a permit taken and its release put in the scope in one step (`takeScoped`, which
      // serves its waiters in arrival order), or the wait timed out having taken nothing.
      const queued = permits.takeScoped(1).pipe(
        Effect.timeoutOrElse({
          duration: waitBound,
          orElse: () => Effect.andThen(Metric.update(refused, 1), Effect.fail(busy))
        })
      )
      // Put in the scope as it is (`Scope.addFinalizer`), not through `Effect.addFinalizer`: that one runs
      // its finalizer in the context it was added in, merged into the closing fiber's, a copy of the whole
      // service map on every paid request (D535).
      const releasePermit = permits.release(1)
      const enter: Effect.Effect<void, ServiceUnavailable, Scope.Scope> = Effect.uninterruptibleMask(
        (restore) =>
          Effect.suspend(() => {
            // A permit free and nobody waiting: taken at once, no queue, no timer. With anyone waiting a
            // newcomer queues behind them (`takeIfAvailable` alone would let it take a permit released to
            // a waiter that has not woken yet).
            const free = waitingNow === 0 ? permits.takeIfAvailable(1) : Effect.succeed(false)
            return Effect.flatMap(free, (taken) =>
              taken
                ? Effect.flatMap(Effect.scope, (scope) => Scope.addFinalizer(scope, releasePermit))
                : Effect.andThen(waitingBy(1), restore(queued).pipe(Effect.ensuring(waitingBy(-1))))
            )
          })
      )
      return AdmissionBound.of({ enter, waiting: Effect.sync(() => waitingNow) })
    })

  static readonly layer = Layer.effect(
    AdmissionBound,
    Effect.flatMap(RouterConfig, (config) => AdmissionBound.make(config.admission))
  )
}

/** Paid requests waiting for an admission permit. */
const waiting = Metric.gauge("router_admission_waiting", {
  description: "Paid requests waiting for an admission permit"
})
const refused = Metric.counter("router_admission_refused_total", {
  description: "Paid requests refused 503 router_busy after waiting the admission bound",
  incremental: true
})
