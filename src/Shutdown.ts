import { Clock, Config, Deferred, Duration, Effect, Layer, Option } from "effect"
import * as Runtime from "effect/Runtime"
import { LiveStreams } from "./inference/LiveStreams.ts"
import { Drain } from "./process/Drain.ts"

/**
 * The process lifecycle, from start to exit (docs/decisions.md D78). The router owns SIGTERM and SIGINT:
 * 1. the first signal starts the drain: new paid work is refused (503 `draining`, `Retry-After`), `/ready`
 *    answers 503 `draining`, and admitted work finishes, up to `DRAIN_TIMEOUT_SECONDS`;
 * 2. at the deadline, or at a second signal, whatever still runs is interrupted: each request settles
 *    what it delivered (capture, receipt) and its stream ends with a final event;
 * 3. the layers close in reverse order of start: the simulated fleet, the HTTP server, the services and
 *    their background loops, then the database and the chain; the process exits 0.
 * A third signal exits at once (the embedded database and chain still stop, tied to this process).
 * A signal during start stops the start and closes whatever had started.
 */

const DrainTimeout = Config.Int("DRAIN_TIMEOUT_SECONDS").pipe(
  Config.withDefault(20),
  Config.map((seconds) => Duration.seconds(Math.max(0, seconds)))
)
/** How long interrupted work may take to settle before the layers close anyway. */
const SETTLE_TIMEOUT = "15 seconds"

interface Signals {
  readonly stop: Deferred.Deferred<NodeJS.Signals>
  readonly hurry: Deferred.Deferred<NodeJS.Signals>
}

/** What the primary of a `WORKERS=N` router sends a worker to stop it (src/Cluster.ts): a first signal. */
export const SHUTDOWN_MESSAGE = "svc:shutdown"

const listenForSignals = Effect.sync((): Signals => {
  const stop = Deferred.makeUnsafe<NodeJS.Signals>()
  const hurry = Deferred.makeUnsafe<NodeJS.Signals>()
  let received = 0
  const onSignal = (signal: NodeJS.Signals) => {
    received++
    if (received === 1) Deferred.doneUnsafe(stop, Effect.succeed(signal))
    else if (received === 2) Deferred.doneUnsafe(hurry, Effect.succeed(signal))
    else {
      process.stderr.write(`${signal} again: exiting now\n`)
      process.exit(130)
    }
  }
  // Kept until the process exits: a signal during the close must not kill it half-way.
  process.on("SIGTERM", onSignal)
  process.on("SIGINT", onSignal)
  // A worker of `WORKERS=N`: its primary says when to stop. A terminal's Ctrl-C reaches the worker too;
  // either starts the drain, and the pair counts once.
  process.on("message", (message) => {
    if (message === SHUTDOWN_MESSAGE && received === 0) {
      received++
      Deferred.doneUnsafe(stop, Effect.succeed("SIGTERM"))
    }
  })
  return { stop, hurry }
})

/** Stops admitting, waits for admitted work up to `deadline` (or a second signal), then interrupts the rest. */
export const drainInFlight = Effect.fn("Shutdown.drain")(function* (
  deadline: Duration.Duration,
  hurry: Deferred.Deferred<NodeJS.Signals>
) {
  const drain = yield* Drain
  const live = yield* LiveStreams
  const busy = Effect.map(Effect.all([drain.inFlight, live.running]), ([handlers, streams]) => ({
    handlers,
    streams
  }))
  const isIdle = Effect.map(busy, ({ handlers, streams }) => handlers + streams === 0)
  const started = yield* Clock.currentTimeMillis
  yield* drain.begin
  yield* Effect.logInfo("draining: no new paid work; waiting for the work in flight").pipe(
    Effect.annotateLogs({ ...(yield* busy), deadline_s: Duration.toSeconds(deadline) })
  )
  const waitIdle = isIdle.pipe(
    Effect.flatMap((idle) => (idle ? Effect.succeed(true) : Effect.as(Effect.sleep("50 millis"), false))),
    Effect.repeat({ until: (idle) => idle })
  )
  const finished = yield* waitIdle.pipe(
    Effect.as(true),
    Effect.raceFirst(Effect.as(Effect.sleep(deadline), false)),
    Effect.raceFirst(Effect.as(Deferred.await(hurry), false))
  )
  if (!finished) {
    yield* Effect.logWarning("drain cut short: interrupting the rest; each settles what it delivered").pipe(
      Effect.annotateLogs(yield* busy)
    )
    // Work admitted while the rest was being stopped is stopped in the next round.
    yield* live.stopAll.pipe(
      Effect.andThen(Effect.sleep("50 millis")),
      Effect.andThen(isIdle),
      Effect.repeat({ until: (idle) => idle }),
      Effect.timeoutOrElse({
        duration: SETTLE_TIMEOUT,
        orElse: () => Effect.logError("work still running after the settle timeout; closing anyway")
      })
    )
  }
  const ended = yield* Clock.currentTimeMillis
  yield* Effect.logInfo("drained").pipe(Effect.annotateLogs({ ms: ended - started, cut_short: !finished }))
})

/** Builds the router, serves until a signal, drains, then closes every layer in reverse order. */
export const serveUntilSignalled = <E>(router: Layer.Layer<Drain | LiveStreams, E>) =>
  Effect.gen(function* () {
    const signals = yield* listenForSignals
    const deadline = yield* DrainTimeout
    const services = yield* Effect.scoped(
      Effect.gen(function* () {
        const scope = yield* Effect.scope
        const built = yield* Layer.buildWithScope(router, scope).pipe(
          Effect.map(Option.some),
          Effect.raceFirst(Effect.as(Deferred.await(signals.stop), Option.none()))
        )
        if (Option.isNone(built)) {
          yield* Effect.logInfo("stopped while starting")
          return
        }
        const signal = yield* Deferred.await(signals.stop)
        yield* Effect.logInfo(`${signal}: shutting down`)
        yield* drainInFlight(deadline, signals.hurry).pipe(Effect.provideContext(built.value))
        yield* Effect.logInfo("closing the HTTP server, the services, the database and the chain")
      })
    )
    yield* Effect.logInfo("stopped")
    return services
  })

/** Like `NodeRuntime.runMain`, but the signals are the router's own (above) and the exit is explicit. */
export const runRouter = <E>(router: Layer.Layer<Drain | LiveStreams, E>) =>
  Runtime.makeRunMain(({ fiber, teardown }) => {
    fiber.addObserver((exit) => teardown(exit, (code) => process.exit(code)))
  })(serveUntilSignalled(router))
