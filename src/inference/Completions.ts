import { randomBytes } from "node:crypto"
import { Cause, Clock, Context, Deferred, Effect, Exit, Layer, Option, Stream } from "effect"
import type { Address } from "viem"
import { charge, feeSplit } from "../domain/Billing.ts"
import { type ChatCompletionRequest, maxTokensOf } from "../domain/Chat.ts"
import {
  CapabilityUnsupported,
  type FeatureGated,
  gated,
  type InvalidRequest,
  NotFound,
  ServiceUnavailable,
  UpstreamFailed
} from "../domain/Errors.ts"
import { PaymentRequired } from "../domain/Payment.ts"
import { epochOf } from "../ledger/Epochs.ts"
import { Ledger } from "../ledger/Ledger.ts"
import type { ReceiptBody } from "../ledger/Receipt.ts"
import { type AuctionCleared, type RankedBid, rivalCounterfactuals } from "../market/Auction.ts"
import { Latency } from "../market/Latency.ts"
import { Market } from "../market/Market.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"
import { PaymentVerifier, type VerifiedPayment } from "../payment/PaymentVerifier.ts"
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

export interface Admitted {
  readonly requestId: string
  readonly createdAt: number
  readonly request: ChatCompletionRequest
  readonly auction: AuctionCleared
  readonly payment: VerifiedPayment
  readonly stream: LiveStream<ServeEvent>
  readonly streamToken: string
}

export type CompletionError =
  | InvalidRequest
  | CapabilityUnsupported
  | FeatureGated
  | NotFound
  | PaymentRequired
  | ServiceUnavailable
  | UpstreamFailed

/** Vendor-native hosted tools the router will not run (computer use, hosted browsing, ...). */
const isHostedTool = (tool: { readonly type: string }) => tool.type !== "function"

/** A fallback provider serves only if its own ask fits inside what the caller already authorized. */
const MAX_ATTEMPTS = 2

const newRequestId = () => `req_${randomBytes(12).toString("hex")}`

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
        promptTokens: number
      ) {
        const outcome = yield* market.clear(marketRequestOf(request, promptTokens))
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
        const auction = yield* route(request, promptEstimate)
        const worstCase = auction.clearedCost
        const description = `${auction.winner.model_class} completion, at most ${maxTokensOf(request)} output tokens`
        if (context.paymentHeader === undefined) {
          return yield* verifier.quote({ worstCase, resourceUrl: context.resourceUrl, description })
        }
        const payment = yield* verifier.verifyExact({
          header: context.paymentHeader,
          worstCase,
          resourceUrl: context.resourceUrl,
          description,
          nonceUnused: ledger.nonceUnused
        })
        const requestId = newRequestId()
        const createdAt = yield* Clock.currentTimeMillis
        const authorized = Number(payment.value)
        yield* Effect.annotateCurrentSpan({
          request_id: requestId,
          model_class: auction.winner.model_class,
          winner: auction.winner.provider_id,
          price_setter: auction.priceSetter
        })
        yield* ledger
          .reserveX402(
            {
              requestId,
              dialect: context.dialect,
              payer: payment.payer,
              requestedModel: request.model,
              modelClass: auction.winner.model_class,
              providerId: auction.winner.provider_id,
              authorized,
              agent: agentRecord(context.agent)
            },
            {
              nonce: payment.authorization.nonce,
              validAfter: payment.authorization.validAfter,
              validBefore: payment.authorization.validBefore,
              signature: payment.signature
            }
          )
          .pipe(
            Effect.catchTag("NonceReplay", () => {
              const { _tag, ...quote } = verifier.quote({
                worstCase,
                resourceUrl: context.resourceUrl,
                description
              })
              return Effect.fail(
                new PaymentRequired({
                  ...quote,
                  code: "payment_invalid",
                  error: "authorization already used"
                })
              )
            })
          )

        const started = yield* Deferred.make<void, UpstreamFailed>()
        const { stream, token } = yield* live.start<ServeEvent>(requestId, (emit) =>
          serve({
            requestId,
            createdAt,
            request,
            auction,
            payer: payment.payer,
            authorized,
            promptEstimate,
            emit,
            started
          })
        )
        // Headers go out only once the winner (or its fallback) has produced its first event,
        // so a provider that fails before the first token is a clean 502 with nothing charged.
        yield* Deferred.await(started)
        return { requestId, createdAt, request, auction, payment, stream, streamToken: token }
      })

      interface ServeInput {
        readonly requestId: string
        readonly createdAt: number
        readonly request: ChatCompletionRequest
        readonly auction: AuctionCleared
        readonly payer: Address
        readonly authorized: number
        readonly promptEstimate: number
        readonly emit: (event: ServeEvent) => Effect.Effect<void>
        readonly started: Deferred.Deferred<void, UpstreamFailed>
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
                        if (meter.heldSources !== undefined) yield* input.emit({ _tag: "Delta", event: meter.heldSources })
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

        return run.pipe(
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
          const reported = meter.usage
          const reasoningText = meter.reasoning.join("")
          const reasoningEstimate = reasoningText.length > 0 ? countTextTokens(reasoningText) : 0
          const usage: MeteredUsage = {
            promptTokens: reported?.inputTokens ?? input.promptEstimate,
            completionTokens:
              reported?.outputTokens ?? countTextTokens(meter.pieces.join("")) + reasoningEstimate,
            reasoningTokens: reported?.reasoningTokens ?? reasoningEstimate,
            cachedTokens: reported?.cachedInputTokens ?? 0,
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
            payment_ref: "",
            refund_ref: null,
            ttft_ms: ttftMs,
            status,
            settlement: released ? "none" : "pending",
            epoch_id: epochOf(input.createdAt, config.epochSeconds),
            session_id: input.request.routing?.session_id ?? null,
            quotes_competing: auction.eligible,
            created_at: input.createdAt
          }
          const economics = economicsOf(input, meter.servedBy, tokens, charged, ttftMs)
          if (released) yield* ledger.release({ receipt, economics })
          else yield* ledger.capture({ receipt, economics })
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
            yield* Deferred.fail(
              input.started,
              new UpstreamFailed({
                code: error?.code ?? "upstream_failed",
                message: `${error?.message ?? "the provider failed"}; the reservation was released and nothing was charged`
              })
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

      return Completions.of({ admit })
    })
  )
}

const agentRecord = (agent: AgentHeaders): Record<string, string> => {
  const record: Record<string, string> = {}
  if (agent.role !== undefined) record.role = agent.role
  if (agent.parentTask !== undefined) record.parent_task = agent.parentTask
  if (agent.agentId !== undefined) record.agent_id = agent.agentId
  return record
}
