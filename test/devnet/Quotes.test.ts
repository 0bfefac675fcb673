import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import fc from "fast-check"
import { recoverMessageAddress } from "viem"
import { classReserves, defaultFleet, simulationAccount } from "../../src/devnet/fleet/FleetConfig.ts"
import { freshQuote, maxPriceMove, movedPrice, unsignedQuote } from "../../src/devnet/fleet/Quotes.ts"
import { quoteSigningString, SignedQuote } from "../../src/domain/Quote.ts"

const offers = defaultFleet.flatMap((provider) => provider.offers.map((offer) => ({ provider, offer })))

describe("fleet definition", () => {
  it("covers every class, with rivals where auctions need them and both dialects", () => {
    assert.isAtLeast(defaultFleet.length, 7)
    const providersPerClass = (cls: string) =>
      defaultFleet.filter((p) => p.offers.some((o) => o.modelClass === cls)).length
    for (const cls of Object.keys(classReserves)) assert.isAtLeast(providersPerClass(cls), 1, cls)
    assert.isAtLeast(providersPerClass("chat-medium"), 2)
    assert.isAtLeast(providersPerClass("chat-large"), 2)
    assert.isAtLeast(defaultFleet.filter((p) => p.dialect === "anthropic").length, 2)
    assert.isAtLeast(defaultFleet.filter((p) => p.dialect === "openai").length, 2)
    const signers = new Set(defaultFleet.map((p) => simulationAccount(p.providerId).address))
    assert.strictEqual(signers.size, defaultFleet.length)
    assert.strictEqual(
      simulationAccount("sim-openai-1").address,
      simulationAccount("sim-openai-1").address,
      "keys are derived deterministically"
    )
  })
})

describe("price moves", () => {
  it("stay within 2% of base, integral, at least 1 and never above the reserve", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 50_000_000 }),
        fc.integer({ min: -2_000_000, max: 2_000_000 }),
        fc.integer({ min: 1, max: 60_000_000 }),
        (base, delta, reserve) => {
          const price = movedPrice(base, delta, reserve)
          assert.isTrue(Number.isSafeInteger(price))
          assert.isAtLeast(price, 1)
          assert.isAtMost(price, reserve)
          assert.isAtMost(price, base + maxPriceMove(base))
          assert.isAtLeast(price, Math.min(reserve, Math.max(1, base - maxPriceMove(base))))
        }
      )
    )
  })

  it("keep every fleet quote below its class reserve and the cached rate below the input rate", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...offers),
        fc.integer({ min: -1_000_000, max: 1_000_000 }),
        fc.integer({ min: -1_000_000, max: 1_000_000 }),
        ({ provider, offer }, deltaIn, deltaOut) => {
          const q = unsignedQuote(provider, offer, { quoteId: "q-1", nowSeconds: 1_000, deltaIn, deltaOut })
          const reserve = classReserves[offer.modelClass]
          assert.isAtMost(q.price_in, reserve.priceIn)
          assert.isAtMost(q.price_out, reserve.priceOut)
          assert.isAtMost(Math.abs(q.price_in - offer.priceIn), maxPriceMove(offer.priceIn))
          assert.isAtMost(Math.abs(q.price_out - offer.priceOut), maxPriceMove(offer.priceOut))
          assert.strictEqual(q.valid_until, 1_030)
          assert.strictEqual(q.price_in_cached !== undefined, offer.session !== undefined)
          assert.strictEqual(q.session_ttl_s !== undefined, offer.session !== undefined)
          if (q.price_in_cached !== undefined) assert.isAtMost(q.price_in_cached, q.price_in)
        }
      )
    )
  })
})

describe("quote signing", () => {
  it.effect("signs EIP-191 over the protocol string; the signature recovers to the provider's signer", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(1_700_000_000_000)
      for (const { provider, offer } of offers) {
        const account = simulationAccount(provider.providerId)
        const quote = yield* freshQuote(provider, offer, account)
        assert.instanceOf(quote, SignedQuote)
        Schema.decodeUnknownSync(SignedQuote)({ ...quote })
        assert.strictEqual(quote.valid_until, 1_700_000_030)
        assert.strictEqual(quote.model_class, offer.modelClass)
        const recovered = yield* Effect.promise(() =>
          recoverMessageAddress({ message: quoteSigningString(quote), signature: quote.sig as `0x${string}` })
        )
        assert.strictEqual(recovered, account.address)
        const other = yield* Effect.promise(() =>
          recoverMessageAddress({
            message: quoteSigningString({
              ...quote,
              price_in: SignedQuote.fields.price_in.make(quote.price_in + 1)
            }),
            signature: quote.sig as `0x${string}`
          })
        )
        assert.notStrictEqual(other, account.address)
      }
    })
  )

  it.effect("uses a fresh quote id every time", () =>
    Effect.gen(function* () {
      const { provider, offer } = offers[0]!
      const account = simulationAccount(provider.providerId)
      const ids = new Set<string>()
      for (let i = 0; i < 20; i++) ids.add((yield* freshQuote(provider, offer, account)).quote_id)
      assert.strictEqual(ids.size, 20)
    })
  )
})
