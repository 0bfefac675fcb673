import { Cause, Deferred, Effect, Exit, Scope } from "effect"
import { charge } from "../domain/Billing.ts"
import { maxTokensOf } from "../domain/Chat.ts"
import { ServiceUnavailable, UpstreamFailed } from "../domain/Errors.ts"
import type { PaidBy } from "../ledger/Records.ts"
import type { Settle } from "../ledger/Settle.ts"
import type { HeldLease, Slot } from "../market/QuoteBook.ts"
import { billableTokens, type Meter, meteredUsage } from "./Meter.ts"
import type { Funding, Launch, ServeEvent, ServeSummary } from "./Paid.ts"

/**
 * How a served request ends (the serve step's other half, `Serve.ts`): the reservation it holds, what its
 * meter bills, the release that settles it once on every exit, and how its readers and the waiting
 * admission are told the end (before the settling statement for an answer paid by a key or x402 alone,
 * D534; after it otherwise).
 */

export type Started = Deferred.Deferred<void, UpstreamFailed | ServiceUnavailable>

/**
 * A funded request, held as one scoped resource (`Serve.reserve`): its launch, the meter its serving
 * fills, the capacity slot it holds, and the summary its release settles (published by the release).
 */
export interface Reservation extends Launch {
  readonly meter: Meter
  readonly holding: Holding
  readonly settled: Deferred.Deferred<ServeSummary>
  readonly telling: Telling
}

export interface Serving extends Reservation {
  /** An event to the request's stream, at once (several may go in one step, D565). */
  readonly publish: (event: ServeEvent) => void
  /** The stream's last event was published: its readers are told the end (LiveStreams, D534). */
  readonly end: Effect.Effect<void>
  readonly started: Started
}

/**
 * How the readers and the waiting admission are told the request's end (`End`), set once serving starts
 * and taken once: by the release, as soon as it knows the summary and before the settling statement,
 * when the caller may have its reply first (`answersFirst`); else once the release has settled.
 */
export interface Telling {
  tell: ((summary: ServeSummary) => Effect.Effect<void>) | undefined
}

/**
 * Whether the reply may go out before the settlement's statement commits (D534): a call paid by a
 * funded key or an x402 authorization alone. A session's next turn takes the session only once this one
 * settled, and a task's next call draws on the task hold this one releases, so theirs wait for it.
 */
const answersFirst = (input: Launch) =>
  (input.source._tag === "Credit" || input.source._tag === "X402") && input.chargeCap === undefined

/** Takes the telling (once) and tells the summary. */
export const tellOnce = (telling: Telling, summary: ServeSummary) =>
  Effect.suspend(() => {
    const tell = telling.tell
    telling.tell = undefined
    return tell === undefined ? Effect.void : tell(summary)
  })

/**
 * The capacity slot of the attempt that serves (or last tried to), held until the request is settled:
 * the settling statement deletes its lease row, so letting it go costs no round trip of its own.
 */
export interface Holding {
  scope: Scope.Closeable | undefined
  slot: Slot | undefined
  /** The winner's lease the reservation's statement asked for (D311), until the first attempt takes it. */
  reserved: HeldLease | undefined
}

/** Lets the held slot go: in memory only once the settlement deleted its row, else with its own delete. */
export const letGo = (holding: Holding) =>
  Effect.suspend(() => {
    const scope = holding.scope
    holding.scope = undefined
    holding.slot = undefined
    return scope === undefined ? Effect.void : Scope.close(scope, Exit.void)
  })

const paidByOf = (funding: Funding): PaidBy =>
  funding._tag === "Credit"
    ? { _tag: "Credit", keyId: funding.keyId }
    : funding._tag === "Session"
      ? { _tag: "Session", sessionId: funding.sessionId }
      : { _tag: "X402", scheme: funding.payment.scheme }

/** What the meter bills so far: its usage, the tokens and the charge (within the authorization and a task's hold). */
export const billed = (input: Launch, meter: Meter) => {
  const usage = meteredUsage(meter, {
    maxTokens: maxTokensOf(input.request),
    promptEstimate: input.promptEstimate,
    cachedEstimate: input.cachedEstimate
  })
  const tokens = billableTokens(usage)
  const charged = meter.delivered
    ? Math.min(charge(tokens, input.auction.clear), input.authorized, input.chargeCap ?? input.authorized)
    : 0
  return { usage, tokens, charged }
}

/**
 * The reservation's release, on every exit of what it was reserved for (served, failed, stopped,
 * refused before serving): captures what the meter says was delivered and releases the rest, once, and
 * publishes the summary the serving fiber announces.
 */
export const settleReservation =
  (settle: Settle["Service"]) => (input: Reservation, exit: Exit.Exit<unknown, unknown>) =>
    Effect.gen(function* () {
      const { auction, meter, holding } = input
      const { usage, tokens, charged } = billed(input, meter)
      const released = !meter.delivered
      const interrupted = Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)
      const status: ServeSummary["status"] = released
        ? "released"
        : Exit.isSuccess(exit) && meter.finish !== null
          ? "ok"
          : "partial"
      const error = interrupted ? { code: "stopped", message: "the request was stopped" } : meter.error
      const ttftMs = meter.delivered ? meter.firstTokenAt - input.createdAt : 0
      const summary: ServeSummary = {
        status,
        finishReason: meter.finish,
        providerId: meter.servedBy.provider_id,
        modelClass: meter.servedBy.model_class,
        usage,
        charged,
        authorized: input.authorized,
        ttftMs,
        error: status === "ok" ? null : error
      }
      yield* Deferred.succeed(input.settled, summary)
      // An answer's reply is built from the events and the summary, both known now: it need not wait for
      // the statement below (the reservation holds the worst case until it commits, D534). A refusal
      // (nothing delivered) is told once its release is written: the caller may retry on the whole hold.
      // Contained: a reader's encoder that throws on the end must not cost the request its settlement (the
      // stream then ends when the work does).
      const first = !released && answersFirst(input)
      if (first) {
        yield* tellOnce(input.telling, summary).pipe(
          Effect.catchCause((cause) =>
            Effect.logError("the end of a reply was not told before its settlement", {
              request_id: input.requestId,
              cause: String(cause)
            })
          )
        )
      }
      // A session remembers the whole conversation so far: the next turn's cached prefix.
      const prefixTokens = usage.promptTokens + usage.completionTokens
      const slot = holding.slot
      // The row the capture ends, unless the lease stays warm for the next request (D555).
      const lease = slot?.endsWith()
      // An answer told first, whose lease stays warm (or that holds none), lets its slot go now and its
      // statement wait for more of its wallet's (D573): the provider's capacity is free once the reply is
      // out, and the warm lease's row is not the statement's to end.
      const linger = first && lease === undefined
      if (linger) yield* letGo(holding)
      const settled = yield* settle.request({
        requestId: input.requestId,
        createdAt: input.createdAt,
        payer: input.payer,
        auction,
        servedBy: meter.servedBy,
        tokens,
        charged,
        authorized: input.authorized,
        status,
        ttftMs,
        paidBy: paidByOf(input.funding),
        source:
          input.source._tag === "SessionOpening" || input.source._tag === "SessionTurn"
            ? { ...input.source, prefixTokens }
            : input.source,
        detail: {
          _tag: "Tokens",
          sessionId: input.request.routing?.session_id ?? null,
          agent: input.agent
        },
        lease,
        linger
      })
      if (settled) slot?.handOff()
    }).pipe(Effect.ensuring(letGo(input.holding)), Effect.orDie)

/**
 * How serving ended once the deadline interrupted it: as the deadline's failure (the meter says why),
 * not as a stop; an exit that was not the interruption (serving ended as the timer fired) stays.
 */
export const pastDeadline = (
  meter: Meter,
  exit: Exit.Exit<void, UpstreamFailed>
): Exit.Exit<void, UpstreamFailed> => {
  if (Exit.isSuccess(exit) || !Cause.hasInterruptsOnly(exit.cause)) return exit
  meter.error = { code: "serve_deadline", message: "the request reached the serving deadline" }
  return Exit.fail(new UpstreamFailed(meter.error))
}

/** Tells the readers (`End`) and the waiting admission how the request ended. */
export const announce = (input: Serving) => (summary: ServeSummary) =>
  Effect.gen(function* () {
    input.publish({ _tag: "End", summary })
    yield* input.end
    if (summary.status === "released") {
      const error = summary.error
      const message = `${error?.message ?? "the provider failed"}; the reservation was released and nothing was charged`
      // Every candidate at its signed capacity is a busy market (503, retry), not a provider fault.
      yield* Deferred.fail(
        input.started,
        error?.code === "capacity_exhausted"
          ? new ServiceUnavailable({ code: "capacity_exhausted", message })
          : new UpstreamFailed({ code: error?.code ?? "upstream_failed", message })
      )
    }
    yield* Deferred.succeed(input.started, undefined)
  })
