import { Clock, Effect } from "effect"
import { charge } from "../domain/Billing.ts"
import { type ChatCompletionRequest, maxTokensOf } from "../domain/Chat.ts"
import { NotFound, ServiceUnavailable } from "../domain/Errors.ts"
import type { PaymentSource } from "../ledger/Ledger.ts"
import { leaseRequestOf, QuoteBook } from "../market/QuoteBook.ts"
import { Rfq } from "../market/Rfq.ts"
import { FundingService } from "../payment/Funding.ts"
import { type SessionRow, Sessions } from "../payment/Sessions.ts"
import { TaskBudgets } from "../payment/TaskBudgets.ts"
import { traced } from "../Telemetry.ts"
import { agentRecord, type Launch, newRequestId, type PaidRequestContext, reservationOf } from "./Paid.ts"
import { marketRequestOf } from "./Requirements.ts"

/**
 * Admission: a gated request is routed through the market (route, rfq, award, clear) and funded, and
 * comes out as a `Launch`, paid for and ready to serve. A fresh request (which may open a session)
 * reserves its worst case from a funded key or a verified x402 authorization; a later turn of an open
 * session draws on the session's budget at its locked tariff, one turn at a time.
 */
export const makeAdmission = Effect.gen(function* () {
  const rfq = yield* Rfq
  const book = yield* QuoteBook
  const fundingService = yield* FundingService
  const sessions = yield* Sessions
  const taskBudgets = yield* TaskBudgets

  /**
   * A task's call holds its worst case on the task before it is funded (in the request's scope, so
   * the hold closes after its capture or release); a task that cannot cover it is a 402 here.
   */
  const holdForTask = (
    context: PaidRequestContext,
    requestId: string,
    worstCase: number,
    description: string
  ) =>
    context.taskToken === undefined && context.taskId === undefined
      ? Effect.succeed(undefined)
      : taskBudgets
          .hold({
            task: context.taskToken !== undefined ? { token: context.taskToken } : { id: context.taskId! },
            requestId,
            worstCase
          })
          .pipe(
            Effect.map((hold) => hold.held),
            Effect.catchTag("TaskRefused", (refused) =>
              Effect.fail(
                fundingService.quote(
                  { worstCase, resourceUrl: context.resourceUrl, description },
                  refused.code,
                  refused.message
                )
              )
            )
          )

  const route = Effect.fnUntraced(function* (
    request: ChatCompletionRequest,
    promptTokens: number,
    opensSession: boolean
  ) {
    const outcome = yield* rfq.run({
      ...marketRequestOf(request, promptTokens),
      requireSessionTariff: opensSession
    })
    if (outcome._tag === "Cleared") return outcome
    if (outcome.reason === "unknown_model_class") {
      return yield* new NotFound({
        code: "model_not_found",
        param: "model",
        message: `Unknown model "${request.model}": use auto, best, cheapest, fastest or a class from /v1/models`
      })
    }
    return yield* new ServiceUnavailable({
      code: "no_eligible_quote",
      message: `No live quote can serve this request (${outcome.reason}); nothing was charged`
    })
  }, traced("Completions.route"))

  /** A request of its own: routed, then funded; with `routing.session_id` it opens that session. */
  const fresh = Effect.fnUntraced(function* (
    request: ChatCompletionRequest,
    context: PaidRequestContext,
    promptEstimate: number
  ) {
    const sessionId = request.routing?.session_id
    const opening = sessionId !== undefined
    const auction = yield* route(request, promptEstimate, opening)
    // An opening call funds its session: it asks for at least the session minimum.
    const worstCase = opening
      ? Math.max(
          auction.clearedCost,
          context.creditKey === undefined ? sessions.settings.minBudget : sessions.settings.keyBudget
        )
      : auction.clearedCost
    const description = opening
      ? `budget for session ${sessionId} (${auction.winner.model_class})`
      : `${auction.winner.model_class} completion, at most ${maxTokensOf(request)} output tokens`
    const requestId = newRequestId()
    const createdAt = yield* Clock.currentTimeMillis
    const chargeCap = yield* holdForTask(context, requestId, worstCase, description)
    let sessionToken: string | undefined
    const { funding, payer, authorized, lease } = yield* fundingService.fund({
      creditKey: context.creditKey,
      paymentHeader: context.paymentHeader,
      signed: context.signed,
      resourceUrl: context.resourceUrl,
      worstCase,
      description,
      reservation: {
        ...reservationOf(requestId, context.dialect, request.model, auction.winner, context.agent),
        sessionId,
        // The reservation takes the winner's capacity slot in the same statement (D311), unless a lease of
        // its (provider, class) is warm here: serving then takes that one, with no round trip (D555).
        lease: book.hasWarm(auction.winningQuote) ? undefined : leaseRequestOf(auction.winningQuote)
      },
      subject: opening ? "this session's budget" : "the worst case of this request",
      // Spec 5.2: a per-turn completion takes `upto` too; a session's budget is `exact` only.
      upto: !opening,
      // An opening call records its session before anything is reserved.
      beforeReserve:
        sessionId === undefined
          ? undefined
          : (payer, budget, source) =>
              Effect.map(
                sessions.open({
                  sessionId,
                  payer: payer.toLowerCase(),
                  fundingKind: source._tag === "Credit" ? "credit" : "x402",
                  fundingRequestId: requestId,
                  keyId: source._tag === "Credit" ? source.keyId : null,
                  budget,
                  providerId: auction.winner.provider_id,
                  modelClass: auction.winner.model_class,
                  priceIn: auction.clear.price_in,
                  priceOut: auction.clear.price_out,
                  priceInCached: auction.clear.price_in_cached ?? null,
                  ttlSeconds: auction.winningQuote.session_ttl_s ?? sessions.settings.defaultTtlSeconds
                }),
                (token) => {
                  sessionToken = token
                }
              ),
      undo: sessionId === undefined ? undefined : sessions.discard(sessionId)
    })
    const paid: Extract<PaymentSource, { _tag: "SessionOpening" }>["funding"] =
      funding._tag === "Credit" ? { _tag: "Credit", keyId: funding.keyId } : { _tag: "X402" }
    return {
      requestId,
      createdAt,
      request,
      auction,
      payer,
      funding,
      source:
        sessionId === undefined
          ? funding._tag === "X402"
            ? { _tag: "X402", scheme: funding.payment.scheme }
            : paid
          : { _tag: "SessionOpening", sessionId, funding: paid, prefixTokens: 0 },
      authorized,
      promptEstimate,
      cachedEstimate: 0,
      sessionToken,
      agent: agentRecord(context.agent),
      chargeCap,
      lease
    } satisfies Launch
  })

  /** A later turn of an open session: no payment of its own, the locked tariff, one at a time. */
  const turn = Effect.fnUntraced(function* (
    request: ChatCompletionRequest,
    context: PaidRequestContext,
    session: SessionRow,
    promptEstimate: number
  ) {
    const lock = {
      providerId: session.provider_id,
      modelClass: session.model_class,
      tariff: {
        price_in: session.price_in,
        price_out: session.price_out,
        ...(session.price_in_cached === null ? {} : { price_in_cached: session.price_in_cached })
      }
    }
    const auction = yield* rfq.run({ ...marketRequestOf(request, promptEstimate), sessionLock: lock })
    if (auction._tag !== "Cleared") {
      return yield* new ServiceUnavailable({
        code: "session_provider_unavailable",
        message: `The session's provider has no live quote for ${session.model_class} (${auction.reason}); nothing was charged`
      })
    }
    // The provider holds the conversation so far in its cache: that prefix bills at the cached rate.
    const cachedEstimate = Math.min(session.prefix_tokens, promptEstimate)
    const worstCase = charge(
      { input: promptEstimate, cachedInput: cachedEstimate, output: maxTokensOf(request) },
      lock.tariff
    )
    const requestId = newRequestId()
    const createdAt = yield* Clock.currentTimeMillis
    const chargeCap = yield* holdForTask(context, requestId, worstCase, `session ${session.session_id} turn`)
    const { funding, payer, authorized } = yield* fundingService.fundTurn({
      sessionId: session.session_id,
      token: context.sessionToken,
      worstCase,
      resourceUrl: context.resourceUrl,
      reservation: reservationOf(requestId, context.dialect, request.model, auction.winner, context.agent)
    })
    return {
      requestId,
      createdAt,
      request,
      auction,
      payer,
      funding,
      source: { _tag: "SessionTurn", sessionId: session.session_id, prefixTokens: 0 },
      authorized,
      promptEstimate,
      cachedEstimate,
      sessionToken: undefined,
      agent: agentRecord(context.agent),
      chargeCap
    } satisfies Launch
  })

  return { fresh, turn }
})
