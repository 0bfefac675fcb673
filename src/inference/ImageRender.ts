import { Clock, Effect, Schema } from "effect"
import { type HttpClient, HttpClientRequest } from "effect/http"
import { UpstreamFailed } from "../domain/Errors.ts"
import { ImagesResponse } from "../domain/Images.ts"
import type { Latency } from "../market/Latency.ts"
import type { Providers } from "../market/Providers.ts"
import type { QuoteBook } from "../market/QuoteBook.ts"

const decodeImages = Schema.decodeUnknownEffect(ImagesResponse)

const PNG_MAGIC = "89504e470d0a1a0a"
const isPng = (b64: string) =>
  Buffer.from(b64.slice(0, 12), "base64").subarray(0, 8).toString("hex") === PNG_MAGIC

/** A generated image may take a while; past this the reservation is released. */
const PROVIDER_TIMEOUT_MS = 120_000

export interface RenderServices {
  readonly client: HttpClient.HttpClient
  readonly book: QuoteBook["Service"]
  readonly providers: Providers["Service"]
  readonly latency: Latency["Service"]
}

/**
 * The serve step of an image: the winning provider's images endpoint, holding one capacity slot of
 * its quote; one PNG back, inline as base64. Its time to the image is its measured latency.
 */
export const renderImage =
  ({ client, book, providers, latency }: RenderServices) =>
  (winner: { readonly provider_id: string; readonly model_class: string }, prompt: string, size: string) =>
    Effect.scoped(
      Effect.gen(function* () {
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
                new UpstreamFailed({ code: "upstream_connect", message: "the image provider is unreachable" })
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
          Effect.flatMap(decodeImages),
          Effect.mapError(
            () =>
              new UpstreamFailed({ code: "upstream_protocol", message: "the image provider sent no image" })
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
