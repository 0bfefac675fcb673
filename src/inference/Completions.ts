import { randomBytes } from "node:crypto"
import { Cause, Clock, Context, Deferred, Effect, Exit, Layer, Option, Schedule, Stream } from "effect"
import { charge, feeSplit } from "../domain/Billing.ts"
import { type ChatCompletionRequest, maxTokensOf } from "../domain/Chat.ts"
import {
  CapabilityUnsupported,
  Conflict,
  type FeatureGated,
  type Forbidden,
  gated,
  type InvalidRequest,
  NotFound,
  ServiceUnavailable,
  Unauthorized,
  UpstreamFailed
} from "../domain/Errors.ts"
import { PaymentRequired } from "../domain/Payment.ts"
import { epochOf } from "../ledger/Epochs.ts"
import { Ledger, type PaymentSource } from "../ledger/Ledger.ts"
import type { ReceiptBody } from "../ledger/Receipt.ts"
import { type AuctionCleared, type RankedBid, rivalCounterfactuals } from "../market/Auction.ts"
import { Latency } from "../market/Latency.ts"
import { Market } from "../market/Market.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"
import { type Funding, FundingService } from "../payment/Funding.ts"
import { PaymentVerifier } from "../payment/PaymentVerifier.ts"
import { type SessionRow, Sessions, type TurnRefusal } from "../payment/Sessions.ts"
import { RouterConfig } from "../RouterConfig.ts"
import type { FinishReason, UpstreamEvent } from "./Events.ts"
import { type LiveStream, LiveStreams } from "./LiveStreams.ts"
import { marketRequestOf } from "./Requirements.ts"
import { countTextTokens, estimatePromptTokens } from "./Tokens.ts"
import { Upstream } from "./upstream/Upstream.ts"

export interface AgentHeaders {
  readonly role?: string | undefined
  readonly parentTask?: string | undefined
  readonly agentId?: string | undefined
}

export interface PaidRequestContext {
  readonly dialect: "openai" | "anthropic" | "responses"
  readonly paymentHeader: string | undefined
  /** `x-session-token`: a later turn of an open session. */
  readonly sessionToken?: string | undefined
  /** `x-credit-key`: spend a funded key's budget instead of signing per request. */
  readonly creditKey?: string | undefined
  readonly resourceUrl: string
  readonly agent: AgentHeaders
}

export interface MeteredUsage {
  readonly promptTokens: number
  readonly completionTokens: number
  readonly reasoningTokens: number
  readonly cachedTokens: number
  /** Which counts are the router's tokenizer estimate rather than the provider's report. */
  readonly estimated: { readonly prompt: boolean; readonly completion: boolean; readonly reasoning: boolean }
}

export interface ServeSummary {
  readonly status: "ok" | "partial" | "released"
  readonly finishReason: FinishReason | null
  readonly providerId: string
  readonly modelClass: string
  readonly usage: MeteredUsage
  readonly charged: number
  readonly authorized: number
  readonly ttftMs: number
  readonly error: { readonly code: string; readonly message: string } | null
}

/** What a reader of a served request sees: content as it arrives, then exactly one `End`. */
export type ServeEvent =
  | { readonly _tag: "Delta"; readonly event: Exclude<UpstreamEvent, { _tag: "Usage" | "Finish" }> }
  | { readonly _tag: "End"; readonly summary: ServeSummary }

export type { Funding }

export interface Admitted {
  readonly requestId: string
  readonly createdAt: number
  readonly request: ChatCompletionRequest
  readonly auction: AuctionCleared
  readonly funding: Funding
  readonly stream: LiveStream<ServeEvent>
  readonly streamToken: string
  /** Returned once, when this request opened a session. */
  readonly sessionToken: string | undefined
}

export type CompletionError =
  | Conflict
  | Unauthorized
  | Forbidden
  | InvalidRequest
  | CapabilityUnsupported
  | FeatureGated
  | NotFound
  | PaymentRequired
  | ServiceUnavailable
  | UpstreamFailed

/** Vendor-native hosted tools the router will not run (computer use, hosted browsing, ...). */
const isHostedTool = (tool: { readonly type: string }) => tool.type !== "function"

/** The longest any request is served (then it ends as `partial`, delivered tokens charged). */
export const SERVE_DEADLINE = "15 minutes"

/** A fallback provider serves only if its own ask fits inside what the caller already authorized. */
const MAX_ATTEMPTS = 2

export const newRequestId = () => `req_${randomBytes(12).toString("hex")}`

/**
 * The paid-request lifecycle: gate, route, price, pay, reserve, then serve in a supervised
 * fiber whose exit (success, failure, provider fault, client hang-up, stop, shutdown)
 * captures exactly what was metered and releases the rest, once.
 */
export class Completions extends Context.Service<
  Completions,
  {
    readonly admit: (
      request: ChatCompletionRequest,
      context: PaidRequestContext
    ) => Effect.Effect<Admitted, CompletionError>
  }
>()("router/inference/Completions") {
  static readonly layer = Layer.effect(
    Completions,
    Effect.gen(function* () {
      const market = yield* Market
      const book = yield* QuoteBook
      const providers = yield* Providers
      const latency = yield* Latency
      const verifier = yield* PaymentVerifier
      const ledger = yield* Ledger
      const live = yield* LiveStreams
      const upstream = yield* Upstream
      const config = yield* RouterConfig
      const fundingService = yield* FundingService
      const sessions = yield* Sessions

      const gate = Effect.fn("Completions.gate")(function* (request: ChatCompletionRequest) {
        if (request.context !== undefined) return yield* gated("context_passports")
        if (request.routing?.speculative !== undefined) return yield* gated("speculative_routing")
        const hosted = request.tools?.find(isHostedTool)
        if (hosted !== undefined) {
          return yield* new CapabilityUnsupported({
            code: "unsupported_capability",
            param: "tools",
            message: `Hosted tool "${hosted.type}" is not available through this router; use local function tools`
          })
        }
      })

      const route = Effect.fn("Completions.route")(function* (
        request: ChatCompletionRequest,
        promptTokens: number,
        opensSession = false
      ) {
        const outcome = yield* market.clear({
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
      })

      const admit = Effect.fn("Completions.admit")(function* (
        request: ChatCompletionRequest,
        context: PaidRequestContext
      ) {
        yield* gate(request)
        const promptEstimate = estimatePromptTokens(request.messages)
        const sessionId = request.routing?.session_id
        const session = sessionId === undefined ? undefined : yield* sessions.find(sessionId)
        if (session !== undefined) return yield* admitTurn(request, context, session, promptEstimate)

        const auction = yield* route(request, promptEstimate, sessionId !== undefined)
        // An opening call funds its session: it asks for at least the session minimum.
        const opening = sessionId !== undefined
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
        const reservation = {
          requestId,
          dialect: context.dialect,
          requestedModel: request.model,
          modelClass: auction.winner.model_class,
          providerId: auction.winner.provider_id,
          agent: agentRecord(context.agent),
          sessionId
        }
        let sessionToken: string | undefined
        const { funding, payer, authorized } = yield* fundingService.fund({
          creditKey: context.creditKey,
          paymentHeader: context.paymentHeader,
          resourceUrl: context.resourceUrl,
          worstCase,
          description,
          reservation,
          subject: opening ? "this session's budget" : "the worst case of this request",
          // An opening call records its session before anything is reserved.
          beforeReserve: (payer, budget, source) =>
            sessionId === undefined
              ? Effect.void
              : Effect.map(
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
        const source: PaymentSource =
          sessionId !== undefined
            ? {
                _tag: "SessionOpening",
                sessionId,
                funding:
                  funding._tag === "Credit" ? { _tag: "Credit", keyId: funding.keyId } : { _tag: "X402" },
                prefixTokens: 0
              }
            : funding._tag === "Credit"
              ? { _tag: "Credit", keyId: funding.keyId }
              : { _tag: "X402" }
        return yield* launch({
          requestId,
          createdAt,
          request,
          auction,
          payer,
          funding,
          source,
          authorized,
          promptEstimate,
          cachedEstimate: 0,
          sessionToken,
          agent: agentRecord(context.agent)
        })
      })

      /** A later turn of an open session: no payment of its own, the locked tariff, one at a time. */
      const admitTurn = Effect.fn("Completions.admitTurn")(function* (
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
        const outcome = yield* market.clear({
          ...marketRequestOf(request, promptEstimate),
          sessionLock: lock
        })
        if (outcome._tag !== "Cleared") {
          return yield* new ServiceUnavailable({
            code: "session_provider_unavailable",
            message: `The session's provider has no live quote for ${session.model_class} (${outcome.reason}); nothing was charged`
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
        const taken = yield* sessions
          .takeTurn(session.session_id, context.sessionToken, requestId, worstCase)
          .pipe(Effect.mapError((refusal) => turnRefused(refusal, session.session_id, worstCase, context)))
        yield* ledger.reserveSessionTurn({
          requestId,
          dialect: context.dialect,
          payer: taken.payer,
          requestedModel: request.model,
          modelClass: outcome.winner.model_class,
          providerId: outcome.winner.provider_id,
          authorized: worstCase,
          agent: agentRecord(context.agent),
          sessionId: session.session_id
        })
        return yield* launch({
          requestId,
          createdAt,
          request,
          auction: outcome,
          payer: taken.payer,
          funding: {
            _tag: "Session",
            sessionId: session.session_id,
            budgetRemaining: taken.budget - taken.spent - worstCase
          },
          source: { _tag: "SessionTurn", sessionId: session.session_id, prefixTokens: 0 },
          authorized: worstCase,
          promptEstimate,
          cachedEstimate,
          sessionToken: undefined,
          agent: agentRecord(context.agent)
        })
      })

      const turnRefused = (
        refusal: TurnRefusal,
        sessionId: string,
        worstCase: number,
        context: PaidRequestContext
      ): CompletionError => {
        switch (refusal._tag) {
          case "Unknown":
            return new NotFound({ code: "session_not_found", message: `No session ${sessionId}` })
          case "BadToken":
            return new Unauthorized({
              code: "invalid_session_token",
              message: "Missing or invalid x-session-token"
            })
          case "Busy":
            return new Conflict({
              code: "session_used",
              message:
                "Another request is in flight on this session; retry when it ends or rotate the session"
            })
          case "Closed":
          case "Expired":
            return new Conflict({
              code: "session_used",
              message: `The session is ${refusal._tag === "Closed" ? "closed" : "expired"}; open a new session id`
            })
          case "Dead": {
            const { _tag, ...body } = verifier.quote({
              worstCase,
              resourceUrl: context.resourceUrl,
              description: "session"
            })
            return new PaymentRequired({
              ...body,
              code: "session_dead",
              error: "the session's funding settlement failed; no further turns",
              hint: "open a new session"
            })
          }
          case "Exhausted": {
            const { _tag, ...body } = verifier.quote({
              worstCase,
              resourceUrl: context.resourceUrl,
              description: "session"
            })
            return new PaymentRequired({
              ...body,
              code: "session_budget_exhausted",
              error: `the session has ${refusal.remaining} base units left, less than this turn's worst case ${worstCase}`,
              hint: "close the session and open a new one with a larger budget"
            })
          }
        }
      }

      interface Launch {
        readonly requestId: string
        readonly createdAt: number
        readonly request: ChatCompletionRequest
        readonly auction: AuctionCleared
        readonly payer: string
        readonly funding: Funding
        readonly source: PaymentSource
        readonly authorized: number
        readonly promptEstimate: number
        readonly cachedEstimate: number
        readonly sessionToken: string | undefined
        readonly agent: Record<string, string>
      }

      /** Serves an admitted, paid-for request in its own supervised fiber. */
      const launch = Effect.fn("Completions.launch")(function* (input: Launch) {
        const { requestId, createdAt, request, auction, funding } = input
        yield* Effect.annotateCurrentSpan({
          request_id: requestId,
          model_class: auction.winner.model_class,
          winner: auction.winner.provider_id,
          price_setter: auction.priceSetter,
          funding: funding._tag
        })
        const started = yield* Deferred.make<void, UpstreamFailed | ServiceUnavailable>()
        const { stream, token } = yield* live.start<ServeEvent>(requestId, (emit) =>
          serve({ ...input, emit, started })
        )
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
        }
      })

      interface ServeInput extends Launch {
        readonly emit: (event: ServeEvent) => Effect.Effect<void>
        readonly started: Deferred.Deferred<void, UpstreamFailed | ServiceUnavailable>
      }

      const serve = (input: ServeInput) => {
        const { auction, request } = input
        const maxTokens = maxTokensOf(request)
        const meter = {
          servedBy: auction.winner as RankedBid,
          delivered: false,
          firstTokenAt: 0,
          pieces: [] as Array<string>,
          reasoning: [] as Array<string>,
          usage: undefined as Extract<UpstreamEvent, { _tag: "Usage" }> | undefined,
          finish: null as FinishReason | null,
          error: null as { code: string; message: string } | null,
          heldSources: undefined as Extract<UpstreamEvent, { _tag: "Sources" }> | undefined
        }
        const fallbacks = auction.bids.filter(
          (b) =>
            b.outcome === "lost" &&
            charge({ input: input.promptEstimate, cachedInput: 0, output: maxTokens }, b) <=
              auction.clearedCost
        )
        const candidates = [auction.winner, ...fallbacks].slice(0, MAX_ATTEMPTS)

        const attempt = (bid: RankedBid) =>
          Effect.scoped(
            Effect.gen(function* () {
              const provider = providers.get(bid.provider_id)
              const quote = (yield* book.live).find(
                (q) => q.quote.provider_id === bid.provider_id && q.quote.model_class === bid.model_class
              )
              if (provider === undefined || !provider.enabled || quote === undefined) {
                return yield* Effect.fail(
                  new UpstreamFailed({ code: "provider_unavailable", message: "provider left the market" })
                )
              }
              yield* book
                .acquireSlot(quote.quote)
                .pipe(Effect.mapError((e) => new UpstreamFailed({ code: e.code, message: e.message })))
              meter.servedBy = bid
              meter.heldSources = undefined
              const sentAt = yield* Clock.currentTimeMillis
              yield* upstream
                .stream(
                  { baseUrl: provider.base_url, dialect: provider.dialect },
                  request,
                  bid.model_class,
                  maxTokens
                )
                .pipe(
                  Stream.runForEach((event) =>
                    Effect.gen(function* () {
                      if (event._tag === "Usage") {
                        meter.usage = event
                        return
                      }
                      if (event._tag === "Finish") {
                        meter.finish = event.reason
                        return
                      }
                      if (event._tag === "Sources") {
                        // Grounding arrives before the first token; it is held until a token
                        // proves this provider is serving (a fallback must not repeat it).
                        if (!meter.delivered) meter.heldSources = event
                        else yield* input.emit({ _tag: "Delta", event })
                        return
                      }
                      if (!meter.delivered) {
                        meter.delivered = true
                        meter.firstTokenAt = yield* Clock.currentTimeMillis
                        yield* latency.observe(bid.provider_id, bid.model_class, meter.firstTokenAt - sentAt)
                        if (meter.heldSources !== undefined)
                          yield* input.emit({ _tag: "Delta", event: meter.heldSources })
                        yield* Deferred.succeed(input.started, undefined)
                      }
                      if (event._tag === "TextDelta") meter.pieces.push(event.text)
                      else if (event._tag === "ReasoningDelta") meter.reasoning.push(event.text)
                      else if (event._tag === "ToolCallDelta")
                        meter.pieces.push((event.name ?? "") + event.argumentsDelta)
                      yield* input.emit({ _tag: "Delta", event })
                    })
                  ),
                  Effect.mapError(
                    (e) =>
                      new UpstreamFailed({
                        code: `upstream_${e.reason}`,
                        message: `the provider failed: ${e.message}`
                      })
                  )
                )
            })
          )

        const run = Effect.gen(function* () {
          for (let i = 0; i < candidates.length; i++) {
            const exit = yield* Effect.exit(attempt(candidates[i]!))
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
        // about requests of other instances (docs/decisions.md D42).
        const bounded = run.pipe(
          Effect.timeoutOrElse({
            duration: SERVE_DEADLINE,
            orElse: () => {
              meter.error = { code: "serve_deadline", message: "the request reached the serving deadline" }
              return Effect.fail(new UpstreamFailed(meter.error))
            }
          })
        )
        return Effect.interruptible(bounded).pipe(
          Effect.onExit((exit) => finish(input, meter, exit)),
          Effect.catchCause(() => Effect.void),
          Effect.withSpan("Completions.serve", { attributes: { request_id: input.requestId } })
        )
      }

      const finish = (
        input: ServeInput,
        meter: {
          servedBy: RankedBid
          delivered: boolean
          firstTokenAt: number
          pieces: Array<string>
          reasoning: Array<string>
          usage: Extract<UpstreamEvent, { _tag: "Usage" }> | undefined
          finish: FinishReason | null
          error: { code: string; message: string } | null
          heldSources: Extract<UpstreamEvent, { _tag: "Sources" }> | undefined
        },
        exit: Exit.Exit<void, UpstreamFailed>
      ) =>
        Effect.gen(function* () {
          const { auction } = input
          // Provider-reported counts are trusted only when they are sane: non-negative safe
          // integers, and never more output than the caller allowed.
          const sane = (n: number | undefined, max = Number.MAX_SAFE_INTEGER) =>
            n !== undefined && Number.isSafeInteger(n) && n >= 0 ? Math.min(n, max) : undefined
          const raw = meter.usage
          const reported =
            raw === undefined
              ? undefined
              : {
                  inputTokens: sane(raw.inputTokens),
                  outputTokens: sane(raw.outputTokens, maxTokensOf(input.request)),
                  reasoningTokens: sane(raw.reasoningTokens, maxTokensOf(input.request)),
                  cachedInputTokens: sane(raw.cachedInputTokens)
                }
          const reasoningText = meter.reasoning.join("")
          const reasoningEstimate = reasoningText.length > 0 ? countTextTokens(reasoningText) : 0
          const usage: MeteredUsage = {
            promptTokens: reported?.inputTokens ?? input.promptEstimate,
            completionTokens:
              reported?.outputTokens ?? countTextTokens(meter.pieces.join("")) + reasoningEstimate,
            reasoningTokens: reported?.reasoningTokens ?? reasoningEstimate,
            // A session's provider committed to hold the conversation so far (session_ttl_s):
            // that prefix bills at the cached rate whatever the provider reports.
            cachedTokens: Math.max(reported?.cachedInputTokens ?? 0, input.cachedEstimate),
            estimated: {
              prompt: reported?.inputTokens === undefined,
              completion: reported?.outputTokens === undefined,
              reasoning: reported?.reasoningTokens === undefined && reasoningEstimate > 0
            }
          }
          const tokens = {
            input: usage.promptTokens,
            cachedInput: Math.min(usage.cachedTokens, usage.promptTokens),
            output: usage.completionTokens
          }
          const released = !meter.delivered
          const charged = released ? 0 : Math.min(charge(tokens, auction.clear), input.authorized)
          const interrupted = Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause)
          const status: ServeSummary["status"] = released
            ? "released"
            : Exit.isSuccess(exit) && meter.finish !== null
              ? "ok"
              : "partial"
          const error = interrupted ? { code: "stopped", message: "the request was stopped" } : meter.error
          const ttftMs = meter.delivered ? meter.firstTokenAt - input.createdAt : 0
          const receipt: ReceiptBody = {
            request_id: input.requestId,
            wallet: input.payer.toLowerCase(),
            provider_id: meter.servedBy.provider_id,
            model_class: meter.servedBy.model_class,
            in_tokens: usage.promptTokens,
            out_tokens: usage.completionTokens,
            cached_tokens: tokens.cachedInput,
            price_in: auction.clear.price_in,
            price_out: auction.clear.price_out,
            price_in_cached: auction.clear.price_in_cached ?? null,
            charged,
            authorized: input.authorized,
            payment_ref:
              input.funding._tag === "Credit"
                ? `credit:${input.funding.keyId}`
                : input.funding._tag === "Session"
                  ? `session:${input.funding.sessionId}`
                  : "",
            refund_ref: null,
            ttft_ms: ttftMs,
            status,
            // A funded key's charge is settled on the balance as it is captured.
            settlement: released ? "none" : input.funding._tag === "X402" ? "pending" : "landed",
            epoch_id: epochOf(input.createdAt, config.epochSeconds),
            session_id: input.request.routing?.session_id ?? null,
            quotes_competing: auction.eligible,
            created_at: input.createdAt
          }
          const economics = economicsOf(input, meter.servedBy, tokens, charged, ttftMs)
          // A session remembers the whole conversation so far: the next turn's cached prefix.
          const prefixTokens = usage.promptTokens + usage.completionTokens
          const source: PaymentSource =
            input.source._tag === "SessionOpening" || input.source._tag === "SessionTurn"
              ? { ...input.source, prefixTokens }
              : input.source
          // Settling must not be lost to a passing database fault: it is retried, and it is
          // idempotent (a capture whose first commit went through does nothing the second time).
          yield* (
            released
              ? ledger.release({ receipt, economics, source })
              : ledger.capture({ receipt, economics, source })
          ).pipe(
            Effect.catchDefect((defect) => Effect.fail(defect)),
            Effect.retry({ schedule: Schedule.exponential("100 millis"), times: 8 }),
            Effect.orDie
          )
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
          yield* input.emit({ _tag: "End", summary })
          if (released) {
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
        }).pipe(Effect.orDie, Effect.withSpan("Completions.finish"))

      const economicsOf = (
        input: ServeInput,
        servedBy: RankedBid,
        tokens: { input: number; cachedInput: number; output: number },
        charged: number,
        ttftMs: number
      ) => {
        const { auction } = input
        const ownAsk = charge(tokens, servedBy)
        const { routerFee, providerShare } = feeSplit(charged)
        return {
          request_id: input.requestId,
          version: auction.version,
          mechanism: auction.mechanism,
          profile: auction.profile,
          unit: "base units (6 decimals); prices per 1,000,000 tokens",
          tokens: { input: tokens.input, cached_input: tokens.cachedInput, output: tokens.output },
          winner: {
            provider: servedBy.provider_id,
            model: servedBy.model_class,
            own_ask: { price_in: servedBy.price_in, price_out: servedBy.price_out },
            own_ask_charge: ownAsk
          },
          clear: { price_in: auction.clear.price_in, price_out: auction.clear.price_out },
          price_setter: auction.priceSetter,
          charged,
          authorized: input.authorized,
          second_score_premium: Math.max(0, charged - ownAsk),
          competitors: rivalCounterfactuals(auction.bids, tokens),
          quotes_competing: auction.eligible,
          session_id: input.request.routing?.session_id ?? null,
          agent: input.agent,
          latency: {
            ttft_ms: ttftMs,
            winner_expected_ttft_ms: Math.round(servedBy.score_breakdown.latency_ms),
            winner_latency_penalty: servedBy.score_breakdown.latency_penalty
          },
          fee_split: {
            router_fee_bps: 700,
            router_fee: routerFee,
            provider_share: providerShare,
            total: routerFee + providerShare
          }
        }
      }

      return Completions.of({
        // From the reservation on, the request must reach the fiber that settles it: admission
        // is not interrupted half-way (only the wait for the first token is), so no reservation
        // can outlive its request.
        admit: (request, context) => Effect.uninterruptible(admit(request, context))
      })
    })
  )
}

export const agentRecord = (agent: AgentHeaders): Record<string, string> => {
  const record: Record<string, string> = {}
  if (agent.role !== undefined) record.role = agent.role
  if (agent.parentTask !== undefined) record.parent_task = agent.parentTask
  if (agent.agentId !== undefined) record.agent_id = agent.agentId
  return record
}
