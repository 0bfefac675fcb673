import { Clock, Context, Effect, Exit, Layer } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import { charge, type Tariff } from "../domain/Billing.ts"
import {
  CapabilityUnsupported,
  Conflict,
  InvalidRequest,
  NotFound,
  type PaidCallError,
  ServiceUnavailable
} from "../domain/Errors.ts"
import {
  DEFAULT_IMAGE_SIZE,
  IMAGE_SIZES,
  type ImageGenerationRequest,
  isImageSize
} from "../domain/Images.ts"
import { Settle } from "../ledger/Settle.ts"
import { type AuctionCleared, isRoutingProfile } from "../market/Auction.ts"
import { imageStandardClass } from "../market/Catalog.ts"
import { Latency } from "../market/Latency.ts"
import { ModelCatalog } from "../market/ModelCatalog.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"
import { Rfq } from "../market/Rfq.ts"
import { type Funded, FundingService } from "../payment/Funding.ts"
import { bodyHash, Idempotency } from "../payment/Idempotency.ts"
import { traced } from "../Telemetry.ts"
import { AdmissionBound } from "./AdmissionBound.ts"
import { gateLaunchFeatures } from "./Gate.ts"
import { renderImage } from "./ImageRender.ts"
import { type AgentHeaders, newRequestId, reservationOf } from "./Paid.ts"

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

/** An image request that is paid for: the up-front price reserved, the provider not yet called. */
interface Paid {
  readonly requestId: string
  readonly createdAt: number
  readonly requestedModel: string
  readonly auction: AuctionCleared
  /** Base units charged for the image (the up-front price). */
  readonly price: number
  readonly authorized: number
  readonly payer: string
  readonly funding: ImageFunding
}

export interface GeneratedImage extends Omit<Paid, "payer"> {
  readonly image: { readonly b64_json: string; readonly revised_prompt?: string }
}

export type ImageError = PaidCallError

/**
 * The image lifecycle, on the same steps as completions: the launch gates (`Gate.ts`), the RFQ over
 * image classes only (`market/Rfq.ts`), funding (`payment/Funding.ts`), the provider call
 * (`ImageRender.ts`) and settlement (`ledger/Settle.ts`), with `Idempotency-Key` claimed around it.
 */
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
      const rfq = yield* Rfq
      const fundingService = yield* FundingService
      const idempotency = yield* Idempotency
      const settle = yield* Settle
      const bound = yield* AdmissionBound
      const render = renderImage({
        client: yield* HttpClient.HttpClient,
        book: yield* QuoteBook,
        providers: yield* Providers,
        latency: yield* Latency
      })

      /** Gated fields and shapes this surface will never serve: before any pricing or payment. */
      const gate = Effect.fnUntraced(function* (request: ImageGenerationRequest) {
        yield* gateLaunchFeatures(request)
        if ((request.n ?? 1) !== 1) {
          return yield* new InvalidRequest({
            code: "invalid_request",
            param: "n",
            message: "One image is generated (and billed) per request: n must be 1"
          })
        }
        const size = request.size ?? DEFAULT_IMAGE_SIZE
        if (!isImageSize(size)) {
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
      }, traced("Images.gate"))

      const route = Effect.fnUntraced(function* (request: ImageGenerationRequest, requested: string) {
        if (!isRoutingProfile(requested) && !isImageClass(catalog.find(requested)?.id ?? "")) {
          return yield* new NotFound({
            code: "model_not_found",
            param: "model",
            message: `"${requested}" is not an image class: use auto, best, cheapest, fastest or an image-* class from /v1/models`
          })
        }
        const slo = request.routing?.latency_slo
        const outcome = yield* rfq.run({
          requested,
          promptTokens: IMAGE_UNITS.input,
          maxTokens: IMAGE_UNITS.output,
          minQuality: request.routing?.min_quality,
          latencySlo:
            slo === undefined ? undefined : { deadlineMs: slo.deadline_ms, confidence: slo.confidence },
          onlyClasses: isImageClass
        })
        if (outcome._tag === "Cleared") return outcome
        return yield* new ServiceUnavailable({
          code: "no_eligible_quote",
          message: `No live image quote can serve this request (${outcome.reason}); nothing was charged`
        })
      }, traced("Images.route"))

      /** Captures the up-front price when the image was delivered; otherwise releases everything. */
      const settleImage = (paid: Paid, exit: Exit.Exit<unknown, unknown>) =>
        Effect.gen(function* () {
          const delivered = Exit.isSuccess(exit)
          const { auction, funding } = paid
          const finishedAt = yield* Clock.currentTimeMillis
          const images = delivered ? IMAGE_UNITS.output : 0
          yield* settle.request({
            requestId: paid.requestId,
            createdAt: paid.createdAt,
            payer: paid.payer,
            auction,
            servedBy: auction.winner,
            tokens: { ...IMAGE_UNITS, output: images },
            charged: delivered ? paid.price : 0,
            authorized: paid.authorized,
            status: delivered ? "ok" : "released",
            ttftMs: delivered ? finishedAt - paid.createdAt : 0,
            paidBy: funding._tag === "Credit" ? { _tag: "Credit", keyId: funding.keyId } : { _tag: "X402" },
            source: funding._tag === "Credit" ? { _tag: "Credit", keyId: funding.keyId } : { _tag: "X402" },
            detail: { _tag: "Images", images, unit: IMAGE_PRICE_UNIT }
          })
        }).pipe(Effect.withSpan("Images.settle"))

      const pay = Effect.fnUntraced(function* (
        request: ImageGenerationRequest,
        context: ImageRequestContext,
        auction: AuctionCleared,
        requestedModel: string
      ) {
        const price = auction.clearedCost
        const description = `${auction.winner.model_class}: one image, priced up front`
        if (context.sessionToken !== undefined || request.routing?.session_id !== undefined) {
          return yield* fundingService.quote(
            { worstCase: price, resourceUrl: context.resourceUrl, description },
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
          reservation: reservationOf(requestId, "images", requestedModel, auction.winner, context.agent)
        })
        return {
          requestId,
          createdAt,
          requestedModel,
          auction,
          price,
          authorized,
          payer,
          funding
        } satisfies Paid
      }, traced("Images.pay"))

      const generateOnce = Effect.fnUntraced(function* (
        request: ImageGenerationRequest,
        context: ImageRequestContext
      ) {
        const size = yield* gate(request)
        const requestedModel = request.model ?? "auto"
        // Whatever ends the call once it is paid for (an image, a provider failure, the client
        // hanging up), the reservation is captured or released exactly once: nothing can
        // interrupt between the reservation and the finalizer that settles it. Routed and paid under
        // an admission permit (D531), released before the provider is called.
        return yield* Effect.uninterruptibleMask((restore) =>
          Effect.gen(function* () {
            const { auction, paid } = yield* Effect.scoped(
              Effect.gen(function* () {
                yield* restore(bound.enter)
                const auction = yield* restore(route(request, requestedModel))
                return { auction, paid: yield* pay(request, context, auction, requestedModel) }
              })
            )
            yield* Effect.annotateCurrentSpan({
              request_id: paid.requestId,
              model_class: auction.winner.model_class,
              winner: auction.winner.provider_id,
              funding: paid.funding._tag
            })
            const image = yield* restore(render(auction.winner, request.prompt, size)).pipe(
              Effect.onExit((exit) => settleImage(paid, exit))
            )
            return { ...paid, image } satisfies GeneratedImage
          })
        )
      }, traced("Images.generate"))

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
          // The claim is freed with its scope unless the delivered image completed it first.
          return yield* Effect.uninterruptibleMask((restore) =>
            restore(generateOnce(request, context)).pipe(
              Effect.tap((generated) => idempotency.complete(key, generated.requestId))
            )
          )
        }).pipe(Effect.scoped)
      }

      return Images.of({ generate })
    })
  ).pipe(Layer.provide(FetchHttpClient.layer))
}
