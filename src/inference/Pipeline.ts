import { Context, Effect, Exit, Layer, Scope } from "effect"
import type { ChatCompletionRequest } from "../domain/Chat.ts"
import { Sessions } from "../payment/Sessions.ts"
import { traced } from "../Telemetry.ts"
import { makeAdmission } from "./Admission.ts"
import { AdmissionBound } from "./AdmissionBound.ts"
import { gateChat } from "./Gate.ts"
import { inServices } from "./LiveStreams.ts"
import type { Admitted, CompletionError, Launch, PaidRequestContext } from "./Paid.ts"
import { Serve } from "./Serve.ts"
import { estimatePromptTokens } from "./Tokens.ts"

export type {
  Admitted,
  AgentHeaders,
  CompletionError,
  Funding,
  MeteredUsage,
  PaidRequestContext,
  ServeEvent,
  ServeSummary
} from "./Paid.ts"

/**
 * The paid-request lifecycle of spec 3.1, for every caller dialect: gate (`Gate.ts`), then route,
 * rfq, award and clear (`market/Rfq.ts` over the pure auction) and funding (`Admission.ts`,
 * `payment/Funding.ts`), held as one scoped resource whose release captures exactly what was metered
 * and releases the rest, once (`Serve.reserve`, `ledger/Settle.ts`), then serve (`Serve.ts`) in a
 * supervised fiber that closes that scope with its exit.
 */
export class Pipeline extends Context.Service<
  Pipeline,
  {
    readonly admit: (
      request: ChatCompletionRequest,
      context: PaidRequestContext
    ) => Effect.Effect<Admitted, CompletionError>
  }
>()("router/inference/Pipeline") {
  static readonly layer = Layer.effect(
    Pipeline,
    Effect.gen(function* () {
      const sessions = yield* Sessions
      const serve = yield* Serve
      const admission = yield* makeAdmission
      const bound = yield* AdmissionBound
      const detached = inServices(yield* Effect.context<never>())

      /** Gated, routed, funded and reserved: the reservation and the request's scope that settles it. */
      const reserve = Effect.fnUntraced(function* (
        request: ChatCompletionRequest,
        context: PaidRequestContext
      ) {
        const promptEstimate = estimatePromptTokens(request.messages)
        const sessionId = request.routing?.session_id
        const session = sessionId === undefined ? undefined : yield* sessions.find(sessionId)
        // The request's own scope holds its reservation (`Serve.reserve`: acquired with the release
        // that settles it) and what it took before funding (a task's budget hold). A refused admission
        // closes it here; from launch on the serving fiber owns it and closes it with its exit, which
        // settles the reservation (what was delivered captured, the rest released), then the hold.
        const scope = yield* Scope.make()
        const admitting: Effect.Effect<Launch, CompletionError, Scope.Scope> =
          session === undefined
            ? admission.fresh(request, context, promptEstimate)
            : admission.turn(request, context, session, promptEstimate)
        // Reserved in the router's shared services, not the request's context: the releases it
        // registers (the reservation's, the lease's, a task hold's) keep the context they were
        // registered in until the reply ends (D460).
        const reservation = yield* serve.reserve(admitting).pipe(
          Scope.provide(scope),
          Effect.onError((cause) => Scope.close(scope, Exit.failCause(cause))),
          detached
        )
        return { reservation, scope }
      })

      // Gated first (a request the router will not serve is refused at once, never queued); then only the
      // wait for an admission permit is interruptible before launch: the reservation is made under the
      // permit (released once it is made, D531) and reaches `launch` with no gap between.
      const admit = (request: ChatCompletionRequest, context: PaidRequestContext) =>
        Effect.andThen(
          gateChat(request),
          Effect.uninterruptibleMask((restore) =>
            Effect.scoped(Effect.andThen(restore(bound.enter), reserve(request, context))).pipe(
              Effect.flatMap(({ reservation, scope }) => serve.launch(reservation, scope))
            )
          )
        ).pipe(traced("Completions.admit"))

      return Pipeline.of({
        // From the reservation on, the request must reach the fiber that settles it: admission
        // is not interrupted half-way (only the wait for a permit, before anything is taken, and the
        // wait for the first token are), so no reservation can outlive its request.
        admit
      })
    })
  )
}
