import { Cause, Clock, Context, Deferred, Effect, Exit, Layer, Option, Scope } from "effect"
import { charge } from "../domain/Billing.ts"
import { maxTokensOf } from "../domain/Chat.ts"
import { type ServiceUnavailable, UpstreamFailed } from "../domain/Errors.ts"
import { METER_CHECKPOINT_MS, meterRecordOf } from "../ledger/Metered.ts"
import { Settle } from "../ledger/Settle.ts"
import type { RankedBid } from "../market/Auction.ts"
import { Latency } from "../market/Latency.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"
import { acquireReleaseLean } from "../process/Resource.ts"
import { traced } from "../Telemetry.ts"
import { LiveStreams } from "./LiveStreams.ts"
import { type Meter, newMeter, recordContent } from "./Meter.ts"
import type { Admitted, Launch, ServeEvent, ServeSummary } from "./Paid.ts"
import {
  announce,
  billed,
  type Holding,
  letGo,
  pastDeadline,
  type Reservation,
  type Serving,
  settleReservation,
  tellOnce
} from "./ServeRelease.ts"
import { Upstream } from "./upstream/Upstream.ts"

/** The longest any request is served (then it ends as `partial`, delivered tokens charged). */
export const SERVE_DEADLINE_MS = 15 * 60 * 1000

/** A fallback provider serves only if its own ask fits inside what the caller already authorized. */
const MAX_ATTEMPTS = 2

/**
 * The lease the reservation asked for, if it is this bid's (the winner's): taken once, by the first
 * attempt. Granted, its slot is already held (`Serve.reserve`); refused, the quote's ceiling was
 * reached when the statement ran, and the attempt asks `acquireSlot` once more (a lease may be warm by then).
 */
const reservedLease = (holding: Holding, bid: RankedBid) => {
  const reserved = holding.reserved
  holding.reserved = undefined
  return reserved !== undefined &&
    reserved.lease.providerId === bid.provider_id &&
    reserved.lease.modelClass === bid.model_class
    ? reserved
    : undefined
}

interface Deps {
  readonly book: QuoteBook["Service"]
  readonly providers: Providers["Service"]
  readonly latency: Latency["Service"]
  readonly upstream: Upstream["Service"]
  /** Records the delivered charge as it grows (D211): at most once a second, from a second after the first token. */
  readonly checkpoint: (input: Serving, meter: Meter) => Effect.Effect<void>
}

/**
 * The delivered charge, kept on the request's row while it serves, so that an instance that dies
 * mid-answer is billed for what it delivered on restart (D211): written `METER_CHECKPOINT_MS` after
 * the first token and then at most that often while tokens arrive, one statement, in a fiber of its own
 * (the stream never waits on the database, and a stall only skips checkpoints: one is in flight at a
 * time). An answer shorter than that costs no write beyond its reservation and capture.
 */
const checkpointer =
  (settle: Settle["Service"], scope: Scope.Scope) =>
  (input: Serving, meter: Meter): Effect.Effect<void> =>
    // Run on every token: a read of the clock and a comparison, no generator, unless a checkpoint is due.
    Clock.clockWith((clock) => {
      const now = clock.currentTimeMillisUnsafe()
      // The first one waits a period after the first token too: a short answer costs no write of its own.
      const last = Math.max(meter.checkpointedAt, meter.firstTokenAt)
      if (meter.checkpointing || now - last < METER_CHECKPOINT_MS) return Effect.void
      meter.checkpointing = true
      meter.checkpointedAt = now
      const { tokens, charged } = billed(input, meter)
      return settle
        .recordMeter(
          input.requestId,
          meterRecordOf({
            charged,
            tokens,
            providerId: meter.servedBy.provider_id,
            modelClass: meter.servedBy.model_class,
            tariff: input.auction.clear,
            ttftMs: meter.firstTokenAt - input.createdAt,
            status: "partial",
            final: false
          })
        )
        .pipe(
          Effect.catch((error) =>
            Effect.logDebug("meter checkpoint not written", {
              request_id: input.requestId,
              error: String(error)
            })
          ),
          Effect.ensuring(
            Effect.sync(() => {
              meter.checkpointing = false
            })
          ),
          Effect.forkIn(scope),
          Effect.asVoid
        )
    })

/**
 * One provider's attempt, holding one capacity slot of its quote for the call and its settlement (the
 * previous attempt's slot, if any, is let go first). The slot is taken in a step of its own, which then
 * answers the call: while the reply streams, the fiber keeps no generator of that step (D501). A frame
 * keeps the effect it runs: each is a `suspend` here, so no frame keeps the steps that already ran.
 */
const attempt = (deps: Deps) => (input: Serving, meter: Meter, holding: Holding, bid: RankedBid) =>
  Effect.suspend(() => Effect.flatten(attemptCall(deps, input, meter, holding, bid)))

const attemptCall = (deps: Deps, input: Serving, meter: Meter, holding: Holding, bid: RankedBid) =>
  Effect.gen(function* () {
    const { book, providers, latency, upstream } = deps
    const provider = providers.get(bid.provider_id)
    const quote = (yield* book.live).find(
      (q) => q.quote.provider_id === bid.provider_id && q.quote.model_class === bid.model_class
    )
    if (provider === undefined || !provider.enabled || quote === undefined) {
      return yield* Effect.fail(
        new UpstreamFailed({ code: "provider_unavailable", message: "provider left the market" })
      )
    }
    const reserved = reservedLease(holding, bid)
    // Refused by the reservation's statement at the ceiling, a lease of this instance may have gone warm since
    // (D555): `acquireSlot` takes that one, or asks the ceiling again, before the bid is given up.
    if (reserved === undefined || !reserved.granted) {
      yield* letGo(holding)
      const scope = yield* Scope.make()
      holding.scope = scope
      holding.slot = yield* book.acquireSlot(quote.quote).pipe(
        Scope.provide(scope),
        Effect.mapError((e) => new UpstreamFailed({ code: e.code, message: e.message }))
      )
    }
    meter.servedBy = bid
    meter.heldSources = undefined
    const sentAt = yield* Clock.currentTimeMillis
    // The first token: its provider is serving (held grounding goes out first), its latency observed, and
    // the waiting admission told. Then the token itself, as any other.
    const first = Effect.gen(function* () {
      meter.delivered = true
      meter.firstTokenAt = yield* Clock.currentTimeMillis
      yield* latency.observe(bid.provider_id, bid.model_class, meter.firstTokenAt - sentAt)
      if (meter.heldSources !== undefined) input.publish({ _tag: "Delta", event: meter.heldSources })
      yield* Deferred.succeed(input.started, undefined)
    })
    // Each read's events are handled as they are read, in this fiber (no stream stages held while the reply
    // is open), all in one step but the first token's (D565): metered, published, then one checkpoint.
    const call = Effect.suspend(() =>
      upstream.run(
        { baseUrl: provider.base_url, dialect: provider.dialect },
        input.request,
        bid.model_class,
        maxTokensOf(input.request),
        // Called as each read's events are delivered (the upstream client runs the returned effect before it
        // calls again), so the meter is written here, when called.
        (events) => {
          let at = 0
          let content = false
          // Meters and publishes this read's events from `at` on: false at a first token (still to be taken).
          const meterRead = (): boolean => {
            while (at < events.length) {
              const event = events[at]!
              if (event._tag === "Usage") meter.usage = event
              else if (event._tag === "Finish") meter.finish = event.reason
              else if (event._tag === "Sources") {
                // Grounding arrives before the first token; it is held until a token
                // proves this provider is serving (a fallback must not repeat it).
                if (meter.delivered) input.publish({ _tag: "Delta", event })
                else meter.heldSources = event
              } else if (!meter.delivered) return false
              else {
                recordContent(meter, event)
                input.publish({ _tag: "Delta", event })
                content = true
              }
              at++
            }
            return true
          }
          const checkpoint = () => (content ? deps.checkpoint(input, meter) : Effect.void)
          if (meterRead()) return checkpoint()
          // A first token: its step, then the rest of its read, with no interruption between them (once the
          // provider is serving, the token that proved it is published and metered with it).
          return Effect.andThen(
            Effect.uninterruptible(Effect.andThen(first, Effect.sync(meterRead))),
            Effect.suspend(checkpoint)
          )
        }
      )
    )
    return Effect.mapError(
      call,
      (e) =>
        new UpstreamFailed({
          code: `upstream_${e.reason}`,
          message: `the provider failed: ${e.message}`
        })
    )
  })

/**
 * The serve step: an admitted, paid-for request is served in its own supervised fiber. The winner
 * (or, before the first token, one fallback whose ask fits the authorization) streams through its
 * upstream client holding one capacity slot of its quote; events are metered and emitted as they
 * arrive. Whatever ends the fiber (the reply, a provider fault, a stop, a hang-up, shutdown, the
 * deadline), the request is settled exactly once: what was delivered is captured, the rest released.
 */
export class Serve extends Context.Service<
  Serve,
  {
    /**
     * The funded request as one scoped resource: `admission` (which reserves) is acquired and the
     * release that settles it registered in one uninterruptible step; the release captures what the
     * meter says was delivered and releases the rest, on every exit of the scope it is acquired in.
     */
    readonly reserve: <E>(
      admission: Effect.Effect<Launch, E, Scope.Scope>
    ) => Effect.Effect<Reservation, E, Scope.Scope>
    /**
     * Starts serving in its own fiber, which owns `scope` (the reservation's) from here and closes it
     * with its exit; succeeds once the first token arrived (headers may go out), fails if none will.
     */
    readonly launch: (
      input: Reservation,
      scope: Scope.Closeable
    ) => Effect.Effect<Admitted, UpstreamFailed | ServiceUnavailable>
  }
>()("router/inference/Serve") {
  /** `deadlineMs`: the serving deadline (`SERVE_DEADLINE_MS` unless a test shortens it). */
  static readonly layerWith = (options: { readonly deadlineMs?: number | undefined } = {}) =>
    Layer.effect(
      Serve,
      Effect.gen(function* () {
        const deadlineMs = options.deadlineMs ?? SERVE_DEADLINE_MS
        const book = yield* QuoteBook
        const providers = yield* Providers
        const latency = yield* Latency
        const live = yield* LiveStreams
        const upstream = yield* Upstream
        const settle = yield* Settle
        const checkpoint = checkpointer(settle, yield* Effect.scope)

        const attemptOn = attempt({ book, providers, latency, upstream, checkpoint })
        const release = settleReservation(settle)

        // A lease the reservation's statement took is held from here, in the same uninterruptible step
        // as the reservation and its release (which deletes the lease row with the capture).
        const reserve = <E>(admission: Effect.Effect<Launch, E, Scope.Scope>) =>
          acquireReleaseLean(
            Effect.flatMap(admission, (launch) =>
              Effect.gen(function* () {
                const holding: Holding = { scope: undefined, slot: undefined, reserved: launch.lease }
                if (launch.lease?.granted === true) {
                  holding.scope = yield* Scope.make()
                  holding.slot = yield* book.adoptSlot(launch.lease.lease).pipe(Scope.provide(holding.scope))
                }
                return {
                  ...launch,
                  meter: newMeter(launch.auction.winner),
                  holding,
                  settled: yield* Deferred.make<ServeSummary>(),
                  telling: { tell: undefined }
                } satisfies Reservation
              })
            ),
            release
          )

        /** The winner, then a fallback while nothing was delivered; bounded by the serving deadline. */
        const serve = (input: Serving, scope: Scope.Closeable) => {
          const { auction, request, meter, holding } = input
          const worstAt = { input: input.promptEstimate, cachedInput: 0, output: maxTokensOf(request) }
          const fallbacks = auction.bids.filter(
            (b) => b.outcome === "lost" && charge(worstAt, b) <= auction.clearedCost
          )
          const candidates = [auction.winner, ...fallbacks].slice(0, MAX_ATTEMPTS)

          const run = Effect.gen(function* () {
            for (let i = 0; i < candidates.length; i++) {
              const exit = yield* Effect.exit(attemptOn(input, meter, holding, candidates[i]!))
              if (Exit.isSuccess(exit)) return
              const failure = Cause.findErrorOption(exit.cause)
              const error = Option.isSome(failure)
                ? failure.value
                : new UpstreamFailed({ code: "upstream_defect", message: "the provider call failed" })
              meter.error = { code: error.code, message: error.message }
              // After the first token the caller has bytes: end the stream, charge what was delivered.
              if (meter.delivered || i === candidates.length - 1) return yield* Effect.fail(error)
              yield* Effect.logWarning("provider failed before the first token; trying the next quote", {
                request_id: input.requestId,
                code: error.code
              })
            }
          })

          // Only serving is interruptible (a stop, a hang-up, shutdown); settling is not. No request
          // serves longer than the deadline, which is what lets the reaper and the epoch close reason
          // about requests of other instances (docs/decisions.md D42). The deadline is a timer that
          // interrupts this fiber as a stop does, and serving then ends as the deadline's failure: a
          // `timeout` would race `run` against a sleep in two fibers of their own, per request (D361).
          return Effect.withFiber((fiber) => {
            let late = false
            const deadline = setTimeout(() => {
              late = true
              fiber.interruptUnsafe(fiber.id)
            }, deadlineMs)
            deadline.unref()
            return Effect.interruptible(run).pipe(
              // Closing the reservation's scope with how serving ended settles it (its release), then the
              // task hold it was taken under; the readers are told by the release before its statement
              // when the reply may go first (D534), else here, once it is settled.
              Effect.onExit((exit) => {
                clearTimeout(deadline)
                return Effect.andThen(
                  Scope.close(scope, late ? pastDeadline(meter, exit) : exit),
                  Effect.flatMap(Deferred.await(input.settled), (summary) => tellOnce(input.telling, summary))
                )
              }),
              Effect.catchCause(() => Effect.void),
              traced("Serve.run", { attributes: { request_id: input.requestId } })
            )
          })
        }

        // Untraced: its annotations go on the admission span that calls it (Completions.admit).
        const launch = Effect.fnUntraced(function* (input: Reservation, scope: Scope.Closeable) {
          const { requestId, createdAt, request, auction, funding } = input
          yield* Effect.annotateCurrentSpan({
            request_id: requestId,
            model_class: auction.winner.model_class,
            winner: auction.winner.provider_id,
            price_setter: auction.priceSetter,
            funding: funding._tag
          })
          const started = yield* Deferred.make<void, UpstreamFailed | ServiceUnavailable>()
          const { stream, token } = yield* live.start<ServeEvent>(requestId, (publish, end) => {
            const serving: Serving = { ...input, publish, end, started }
            input.telling.tell = announce(serving)
            return serve(serving, scope)
          })
          // Headers go out only once the winner (or its fallback) has produced its first event,
          // so a provider that fails before the first token is a clean 502 with nothing charged.
          // A caller that hangs up while waiting stops the work: it releases what it reserved.
          yield* Deferred.await(started).pipe(
            Effect.interruptible,
            Effect.onInterrupt(() => live.stop(stream))
          )
          return {
            requestId,
            createdAt,
            request,
            auction,
            funding,
            stream,
            streamToken: token,
            sessionToken: input.sessionToken
          } satisfies Admitted
        })

        return Serve.of({ reserve, launch })
      })
    )
  static readonly layer = Serve.layerWith()
}
