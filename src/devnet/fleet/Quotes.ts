import { Clock, Effect, Random, Schema } from "effect"
import type { PrivateKeyAccount } from "viem/accounts"
import { quoteSigningString, SignedQuote, type UnsignedQuote } from "../../domain/Quote.ts"
import { type ClassOffer, classReserves, type ProviderConfig } from "./FleetConfig.ts"

/** Quotes live this long; the router caps the TTL at 30 s. */
export const quoteTtlSeconds = 30

/** The widest move of one price around its base: 2% (integer base units). */
export const maxPriceMove = (base: number): number => Math.floor(base / 50)

/** A moved price: `base + delta`, kept at least 1 and never above the class reserve. */
export const movedPrice = (base: number, delta: number, reserve: number): number =>
  Math.min(reserve, Math.max(1, base + Math.max(-maxPriceMove(base), Math.min(maxPriceMove(base), delta))))

export interface QuoteDraw {
  readonly quoteId: string
  readonly nowSeconds: number
  readonly deltaIn: number
  readonly deltaOut: number
}

/** The unsigned quote for one offer given the random draws; pure. */
export const unsignedQuote = (
  provider: ProviderConfig,
  offer: ClassOffer,
  draw: QuoteDraw
): UnsignedQuote => {
  const reserve = classReserves[offer.modelClass]
  const priceIn = movedPrice(offer.priceIn, draw.deltaIn, reserve.priceIn)
  const priceOut = movedPrice(offer.priceOut, draw.deltaOut, reserve.priceOut)
  const base = {
    quote_id: draw.quoteId,
    provider_id: provider.providerId,
    model_class: offer.modelClass,
    price_in: priceIn,
    price_out: priceOut,
    max_context: provider.maxContext,
    valid_until: draw.nowSeconds + quoteTtlSeconds,
    capacity_rps: provider.capacityRps
  }
  const session =
    offer.session === undefined
      ? {}
      : {
          // The cached rate follows the moved input price in proportion and never exceeds it.
          price_in_cached: Math.min(
            priceIn,
            Math.floor((offer.session.priceInCached * priceIn) / offer.priceIn)
          ),
          session_ttl_s: offer.session.sessionTtlS
        }
  return Schema.decodeUnknownSync(UnsignedQuoteSchema)({ ...base, ...session })
}

const UnsignedQuoteSchema = SignedQuote.mapFields((fields) => {
  const { sig: _, ...rest } = fields
  return rest
})

export class QuoteSigningError extends Schema.TaggedError<QuoteSigningError>()("QuoteSigningError", {
  providerId: Schema.String,
  cause: Schema.Defect()
}) {}

export const signQuote = Effect.fn("Quotes.signQuote")(function* (
  account: PrivateKeyAccount,
  quote: UnsignedQuote
): Effect.fn.Return<SignedQuote, QuoteSigningError> {
  const sig = yield* Effect.tryPromise({
    try: () => account.signMessage({ message: quoteSigningString(quote) }),
    catch: (cause) => new QuoteSigningError({ providerId: quote.provider_id, cause })
  })
  return new SignedQuote({ ...quote, sig })
})

/** A fresh signed quote for one offer: new id, TTL from now, a small random price move. */
export const freshQuote = Effect.fn("Quotes.freshQuote")(function* (
  provider: ProviderConfig,
  offer: ClassOffer,
  account: PrivateKeyAccount
) {
  const nowSeconds = Math.floor((yield* Clock.currentTimeMillis) / 1000)
  const deltaIn = yield* Random.nextIntBetween(-maxPriceMove(offer.priceIn), maxPriceMove(offer.priceIn))
  const deltaOut = yield* Random.nextIntBetween(-maxPriceMove(offer.priceOut), maxPriceMove(offer.priceOut))
  const nonce = (yield* Random.nextIntBetween(0, 0xffffffff)).toString(16).padStart(8, "0")
  const quoteId = `q-${provider.providerId}-${offer.modelClass}-${nowSeconds}-${nonce}`
  return yield* signQuote(account, unsignedQuote(provider, offer, { quoteId, nowSeconds, deltaIn, deltaOut }))
})
