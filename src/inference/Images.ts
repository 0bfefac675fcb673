import { Clock, Context, Effect, Exit, Layer, Schema } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import { charge, feeSplit, type Tariff } from "../domain/Billing.ts"
import { Routing } from "../domain/Chat.ts"
import {
  CapabilityUnsupported,
  Conflict,
  type FeatureGated,
  type Forbidden,
  gated,
  InvalidRequest,
  NotFound,
  ServiceUnavailable,
  type Unauthorized,
  UpstreamFailed
} from "../domain/Errors.ts"
import { PaymentRequired, type PaymentRequiredCode } from "../domain/Payment.ts"
import { epochOf } from "../ledger/Epochs.ts"
import { Ledger } from "../ledger/Ledger.ts"
import type { ReceiptBody } from "../ledger/Receipt.ts"
import { type AuctionCleared, isRoutingProfile, rivalCounterfactuals, runAuction } from "../market/Auction.ts"
import { imageStandardClass } from "../market/Catalog.ts"
import { Latency } from "../market/Latency.ts"
import { ModelCatalog } from "../market/ModelCatalog.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"
import { type Funded, FundingService } from "../payment/Funding.ts"
import { bodyHash, Idempotency } from "../payment/Idempotency.ts"
import { PaymentVerifier } from "../payment/PaymentVerifier.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { type AgentHeaders, agentRecord, newRequestId } from "./Completions.ts"

/**
 * `POST /v1/images/generations` (spec 4.1, 5.2, 8): one image per request, priced up front.
 *
 * Pricing (docs/decisions.md): an image class is a catalog class whose id starts with `image-`
 * and whose `max_context` is 2, so no chat request (at least 8 prompt tokens) ever fits one.
 * Its quotes keep the market's unit, base units per 1,000,000 units: `price_in` per million
 * prompts, `price_out` per million images. A request is one prompt and one image, so its price
 * is `charge({input: 1, output: 1}, clear)` from the one billing function: exactly the
 * auction's worst case at 1 + 1 scoring units. That price is what the 402 asks, what a funded
 * key reserves, and what is captured when the image is delivered; the receipt records
 * `in_tokens: 1, out_tokens: 1` so anyone can recompute it from the signed tariff.
 *
 * Payment: x402 `exact` or a funded key only. An `upto` signature or a session is refused with
 * a 402 (`wrong_scheme`) before anything is reserved.
 */

export const IMAGE_CLASS_PREFIX = "image-"
export const isImageClass = (id: string) => id.startsWith(IMAGE_CLASS_PREFIX)

/** The default image class, as the catalog lists it. */
export { imageStandardClass }

export const IMAGE_PRICE_UNIT =
  "base units (6 decimals) per 1,000,000 prompts (price_in) and per 1,000,000 images (price_out)"

/** One request: one prompt in, one image out. */
export const IMAGE_UNITS = { input: 1, cachedInput: 0, output: 1 } as const

/** What one image costs at a tariff, in base units. */
export const imagePrice = (tariff: Tariff): number => charge(IMAGE_UNITS, tariff)

export const IMAGE_SIZES = ["256x256", "512x512", "1024x1024"] as const
export const DEFAULT_IMAGE_SIZE = "256x256"

/** The OpenAI images request, plus the router's `routing`; unknown fields are ignored. */
export const ImageGenerationRequest = Schema.Struct({
  prompt: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(32_000)),
  model: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1))),
  n: Schema.optionalKey(Schema.NullOr(Schema.Int)),
  size: Schema.optionalKey(Schema.NullOr(Schema.String)),
  response_format: Schema.optionalKey(Schema.NullOr(Schema.String)),
  quality: Schema.optionalKey(Schema.NullOr(Schema.String)),
  style: Schema.optionalKey(Schema.NullOr(Schema.String)),
  user: Schema.optionalKey(Schema.String),
  routing: Schema.optionalKey(Routing),
  context: Schema.optionalKey(Schema.Unknown)
})
export type ImageGenerationRequest = typeof ImageGenerationRequest.Type

export interface ImageRequestContext {
  readonly paymentHeader: string | undefined
  readonly creditKey: string | undefined
  readonly sessionToken: string | undefined
  readonly idempotencyKey: string | undefined
  readonly resourceUrl: string
  readonly agent: AgentHeaders
}

/** Images are paid by x402 `exact` or a funded key, never by a session. */
export type ImageFunding = Funded["funding"]

export interface GeneratedImage {
  readonly requestId: string
  readonly createdAt: number
  readonly requestedModel: string
  readonly auction: AuctionCleared
  /** Base units charged for the image (the up-front price). */
  readonly price: number
  readonly authorized: number
  readonly funding: ImageFunding
  readonly image: { readonly b64_json: string; readonly revised_prompt?: string }
}

export type ImageError =
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

const ProviderImages = Schema.Struct({
  data: Schema.Array(
    Schema.Struct({
      b64_json: Schema.String,
      revised_prompt: Schema.optionalKey(Schema.NullOr(Schema.String))
    })
  ).check(Schema.isMinLength(1))
})
const decodeProviderImages = Schema.decodeUnknownEffect(ProviderImages)

const PNG_MAGIC = "89504e470d0a1a0a"
const isPng = (b64: string) =>
  Buffer.from(b64.slice(0, 12), "base64").subarray(0, 8).toString("hex") === PNG_MAGIC

/** A generated image may take a while; past this the reservation is released. */
const PROVIDER_TIMEOUT_MS = 120_000

export class Images extends Context.Service<
  Images,
  {
    readonly generate: (
      request: ImageGenerationRequest,
      context: ImageRequestContext
    ) => Effect.Effect<GeneratedImage, ImageError>
  }
>()("router/inference/Images") {
  static readonly layer = Layer.effect(
    Images,
    Effect.gen(function* () {
      const catalog = yield* ModelCatalog
      const book = yield* QuoteBook
      const latency = yield* Latency
      const providers = yield* Providers
      const verifier = yield* PaymentVerifier
      const ledger = yield* Ledger
      const fundingService = yield* FundingService
      const idempotency = yield* Idempotency
      const config = yield* RouterConfig
      const client = yield* HttpClient.HttpClient

      /** Gated fields and shapes this surface will never serve: before any pricing or payment. */
      const gate = Effect.fn("Images.gate")(function* (request: ImageGenerationRequest) {
        if (request.context !== undefined) return yield* gated("context_passports")
        if (request.routing?.speculative !== undefined) return yield* gated("speculative_routing")
        if ((request.n ?? 1) !== 1) {
          return yield* new InvalidRequest({
            code: "invalid_request",
            param: "n",
            message: "One image is generated (and billed) per request: n must be 1"
          })
        }
        const size = request.size ?? DEFAULT_IMAGE_SIZE
        if (!(IMAGE_SIZES as ReadonlyArray<string>).includes(size)) {
          return yield* new InvalidRequest({
            code: "invalid_request",
            param: "size",
            message: `size must be one of ${IMAGE_SIZES.join(", ")}`
          })
        }
        if ((request.response_format ?? "b64_json") !== "b64_json") {
          return yield* new CapabilityUnsupported({
            code: "unsupported_capability",
            param: "response_format",
            message: "Images are returned inline as b64_json; the router hosts no image URLs"
          })
        }
        return size
      })

      const route = Effect.fn("Images.route")(function* (request: ImageGenerationRequest, requested: string) {
        if (!isRoutingProfile(requested) && !isImageClass(catalog.find(requested)?.id ?? "")) {
          return yield* new NotFound({
            code: "model_not_found",
            param: "model",
            message: `"${requested}" is not an image class: use auto, best, cheapest, fastest or an image-* class from /v1/models`
          })
        }
        const slo = request.routing?.latency_slo
        const outcome = runAuction(
          {
            requested,
            promptTokens: IMAGE_UNITS.input,
            maxTokens: IMAGE_UNITS.output,
            minQuality: request.routing?.min_quality,
            latencySlo:
              slo === undefined ? undefined : { deadlineMs: slo.deadline_ms, confidence: slo.confidence },
            nowMs: yield* Clock.currentTimeMillis
          },
          (yield* book.live).filter((q) => isImageClass(q.quote.model_class)),
          catalog.classes,
          yield* latency.lookup
        )
        if (outcome._tag === "Cleared") return outcome
        return yield* new ServiceUnavailable({
          code: "no_eligible_quote",
          message: `No live image quote can serve this request (${outcome.reason}); nothing was charged`
        })
      })

      /** The provider call, holding one capacity slot of the winning quote. */
      const render = (auction: AuctionCleared, prompt: string, size: string) =>
        Effect.scoped(
          Effect.gen(function* () {
            const { winner } = auction
            const provider = providers.get(winner.provider_id)
            const quote = (yield* book.live).find(
              (q) => q.quote.provider_id === winner.provider_id && q.quote.model_class === winner.model_class
            )
            if (provider === undefined || !provider.enabled || quote === undefined) {
              return yield* new UpstreamFailed({
                code: "provider_unavailable",
                message: "provider left the market"
              })
            }
            yield* book
              .acquireSlot(quote.quote)
              .pipe(Effect.mapError((e) => new UpstreamFailed({ code: e.code, message: e.message })))
            const sentAt = yield* Clock.currentTimeMillis
            const response = yield* client
              .execute(
                HttpClientRequest.post(`${provider.base_url}/v1/images/generations`).pipe(
                  HttpClientRequest.bodyJsonUnsafe({
                    model: winner.model_class,
                    prompt,
                    n: 1,
                    size,
                    response_format: "b64_json"
                  })
                )
              )
              .pipe(
                Effect.catchTag("HttpClientError", () =>
                  Effect.fail(
                    new UpstreamFailed({
                      code: "upstream_connect",
                      message: "the image provider is unreachable"
                    })
                  )
                )
              )
            if (response.status < 200 || response.status >= 300) {
              return yield* new UpstreamFailed({
                code: "upstream_http_status",
                message: `the image provider answered ${response.status}`
              })
            }
            const body = yield* response.json.pipe(
              Effect.flatMap(decodeProviderImages),
              Effect.mapError(
                () =>
                  new UpstreamFailed({
                    code: "upstream_protocol",
                    message: "the image provider sent no image"
                  })
              )
            )
            const image = body.data[0]!
            if (!isPng(image.b64_json)) {
              return yield* new UpstreamFailed({
                code: "upstream_protocol",
                message: "the image provider sent no PNG"
              })
            }
            yield* latency.observe(
              winner.provider_id,
              winner.model_class,
              (yield* Clock.currentTimeMillis) - sentAt
            )
            return {
              b64_json: image.b64_json,
              ...(typeof image.revised_prompt === "string" ? { revised_prompt: image.revised_prompt } : {})
            }
          })
        ).pipe(
          Effect.timeoutOrElse({
            duration: PROVIDER_TIMEOUT_MS,
            orElse: () =>
              Effect.fail(
                new UpstreamFailed({ code: "upstream_timeout", message: "the image provider timed out" })
              )
          })
        )

      interface Paid {
        readonly requestId: string
        readonly createdAt: number
        readonly requestedModel: string
        readonly auction: AuctionCleared
        readonly price: number
        readonly authorized: number
        readonly payer: string
        readonly funding: ImageFunding
      }

      /** Captures the up-front price when the image was delivered; otherwise releases everything. */
      const settle = (paid: Paid, exit: Exit.Exit<unknown, unknown>) =>
        Effect.gen(function* () {
          const delivered = Exit.isSuccess(exit)
          const { auction, funding } = paid
          const charged = delivered ? paid.price : 0
          const finishedAt = yield* Clock.currentTimeMillis
          const receipt: ReceiptBody = {
            request_id: paid.requestId,
            wallet: paid.payer.toLowerCase(),
            provider_id: auction.winner.provider_id,
            model_class: auction.winner.model_class,
            in_tokens: IMAGE_UNITS.input,
            out_tokens: delivered ? IMAGE_UNITS.output : 0,
            cached_tokens: 0,
            price_in: auction.clear.price_in,
            price_out: auction.clear.price_out,
            price_in_cached: null,
            charged,
            authorized: paid.authorized,
            payment_ref: funding._tag === "Credit" ? `credit:${funding.keyId}` : "",
            refund_ref: null,
            ttft_ms: delivered ? finishedAt - paid.createdAt : 0,
            status: delivered ? "ok" : "released",
            settlement: !delivered ? "none" : funding._tag === "X402" ? "pending" : "landed",
            epoch_id: epochOf(paid.createdAt, config.epochSeconds),
            session_id: null,
            quotes_competing: auction.eligible,
            created_at: paid.createdAt
          }
          const units = { ...IMAGE_UNITS, output: receipt.out_tokens }
          const ownAsk = charge(units, auction.winner)
          const { routerFee, providerShare } = feeSplit(charged)
          const economics = {
            request_id: paid.requestId,
            version: auction.version,
            mechanism: auction.mechanism,
            profile: auction.profile,
            unit: IMAGE_PRICE_UNIT,
            images: receipt.out_tokens,
            tokens: { input: units.input, cached_input: 0, output: units.output },
            winner: {
              provider: auction.winner.provider_id,
              model: auction.winner.model_class,
              own_ask: { price_in: auction.winner.price_in, price_out: auction.winner.price_out },
              own_ask_charge: ownAsk
            },
            clear: { price_in: auction.clear.price_in, price_out: auction.clear.price_out },
            price_setter: auction.priceSetter,
            charged,
            authorized: paid.authorized,
            second_score_premium: Math.max(0, charged - ownAsk),
            competitors: rivalCounterfactuals(auction.bids, units),
            quotes_competing: auction.eligible,
            latency: { ttft_ms: receipt.ttft_ms },
            fee_split: {
              router_fee_bps: 700,
              router_fee: routerFee,
              provider_share: providerShare,
              total: routerFee + providerShare
            }
          }
          const source =
            funding._tag === "Credit" ? { _tag: "Credit" as const, keyId: funding.keyId } : undefined
          if (delivered) yield* ledger.capture({ receipt, economics, source })
          else yield* ledger.release({ receipt, economics, source })
        }).pipe(Effect.withSpan("Images.settle"))

      const pay = Effect.fn("Images.pay")(function* (
        request: ImageGenerationRequest,
        context: ImageRequestContext,
        auction: AuctionCleared,
        requestedModel: string
      ) {
        const price = auction.clearedCost
        const description = `${auction.winner.model_class}: one image, priced up front`
        const quote = (code?: PaymentRequiredCode, error?: string) => {
          const { _tag, ...body } = verifier.quote({
            worstCase: price,
            resourceUrl: context.resourceUrl,
            description
          })
          return new PaymentRequired({
            ...body,
            ...(code === undefined ? {} : { code }),
            ...(error === undefined ? {} : { error })
          })
        }
        if (context.sessionToken !== undefined || request.routing?.session_id !== undefined) {
          return yield* quote(
            "wrong_scheme",
            "image generation is paid per request (x402 exact) or by a funded key; a session cannot fund it"
          )
        }
        const requestId = newRequestId()
        const createdAt = yield* Clock.currentTimeMillis
        const { funding, payer, authorized } = yield* fundingService.fund({
          creditKey: context.creditKey,
          paymentHeader: context.paymentHeader,
          resourceUrl: context.resourceUrl,
          worstCase: price,
          description,
          subject: "the image",
          reservation: {
            requestId,
            dialect: "images",
            requestedModel,
            modelClass: auction.winner.model_class,
            providerId: auction.winner.provider_id,
            agent: agentRecord(context.agent)
          }
        })
        return { requestId, createdAt, requestedModel, auction, price, authorized, payer, funding }
      })

      const generateOnce = Effect.fn("Images.generate")(function* (
        request: ImageGenerationRequest,
        context: ImageRequestContext
      ) {
        const size = yield* gate(request)
        const requestedModel = request.model ?? "auto"
        const auction = yield* route(request, requestedModel)
        // Whatever ends the call once it is paid for (an image, a provider failure, the client
        // hanging up), the reservation is captured or released exactly once: nothing can
        // interrupt between the reservation and the finalizer that settles it.
        return yield* Effect.uninterruptibleMask((restore) =>
          Effect.gen(function* () {
            const paid: Paid = yield* pay(request, context, auction, requestedModel)
            yield* Effect.annotateCurrentSpan({
              request_id: paid.requestId,
              model_class: auction.winner.model_class,
              winner: auction.winner.provider_id,
              funding: paid.funding._tag
            })
            const image = yield* restore(render(auction, request.prompt, size)).pipe(
              Effect.onExit((exit) => settle(paid, exit))
            )
            return { ...paid, image } satisfies GeneratedImage
          })
        )
      })

      const generate = (request: ImageGenerationRequest, context: ImageRequestContext) => {
        const key = context.idempotencyKey
        if (key === undefined) return generateOnce(request, context)
        return Effect.gen(function* () {
          const claim = yield* idempotency.claim(
            key,
            bodyHash({ path: "/v1/images/generations", body: request })
          )
          if (claim._tag === "Replay") {
            // The image itself is never stored (privacy): a replay points at the receipt.
            return yield* new Conflict({
              code: "idempotency_replay",
              param: "Idempotency-Key",
              message: `This Idempotency-Key already produced request ${claim.requestId}; the image is not stored, its receipt is at /v1/receipts/${claim.requestId}`
            })
          }
          const generated = yield* generateOnce(request, context).pipe(
            Effect.tapError(() => idempotency.abandon(key))
          )
          yield* idempotency.complete(key, generated.requestId)
          return generated
        })
      }

      return Images.of({ generate })
    })
  ).pipe(Layer.provide(FetchHttpClient.layer))
}
