import { createServer } from "node:http"
import { NodeHttpServer } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Redacted, Schema } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { isAddressEqual, recoverMessageAddress } from "viem"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import { classReserves, defaultFleet, simulationAccount } from "../../src/devnet/fleet/FleetConfig.ts"
import { maxPriceMove } from "../../src/devnet/fleet/Quotes.ts"
import { quoteSigningString, SignedQuote } from "../../src/domain/Quote.ts"
import { startStopwatch } from "../support/Stopwatch.ts"
import { postJson } from "./sse.ts"

const Registration = Schema.Struct({
  provider_id: Schema.String,
  signer: Schema.String,
  base_url: Schema.String,
  dialect: Schema.Literals(["openai", "anthropic"])
})
type Registration = typeof Registration.Type

interface RouterState {
  available: boolean
  readonly registry: Map<string, Registration>
  readonly registrations: Array<Registration>
  readonly unauthorized: Array<string | undefined>
  readonly quotes: Array<{ readonly quote: SignedQuote; readonly receivedAt: number }>
  rejected: number
}

const token = "test-operator-token"

/** A stand-in router: checks the operator token and each quote's signature against the registry. */
const fakeRouter = Effect.gen(function* () {
  const state: RouterState = {
    available: true,
    registry: new Map(),
    registrations: [],
    unauthorized: [],
    quotes: [],
    rejected: 0
  }
  const router = yield* HttpRouter.make
  yield* router.add(
    "POST",
    "/v1/admin/providers",
    Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      if (!state.available) return HttpServerResponse.empty({ status: 503 })
      if (request.headers.authorization !== `Bearer ${token}`) {
        state.unauthorized.push(request.headers.authorization)
        return HttpServerResponse.empty({ status: 401 })
      }
      const body = yield* Effect.orDie(Effect.flatMap(request.json, Schema.decodeUnknownEffect(Registration)))
      state.registrations.push(body)
      state.registry.set(body.provider_id, body)
      return HttpServerResponse.jsonUnsafe({ ok: true }, { status: 201 })
    })
  )
  yield* router.add(
    "POST",
    "/provider/quotes",
    Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      if (!state.available) return HttpServerResponse.empty({ status: 503 })
      const quote = yield* Effect.orDie(Effect.flatMap(request.json, Schema.decodeUnknownEffect(SignedQuote)))
      const registered = state.registry.get(quote.provider_id)
      const signer = yield* Effect.promise(() =>
        recoverMessageAddress({ message: quoteSigningString(quote), signature: quote.sig as `0x${string}` })
      )
      if (registered === undefined || !isAddressEqual(signer, registered.signer as `0x${string}`)) {
        state.rejected++
        return HttpServerResponse.jsonUnsafe({ error: "unknown provider or bad signature" }, { status: 400 })
      }
      state.quotes.push({ quote, receivedAt: Math.floor(Date.now() / 1000) })
      return HttpServerResponse.jsonUnsafe({ ok: true }, { status: 201 })
    })
  )
  const server = yield* NodeHttpServer.make(() => createServer(), { port: 0, host: "127.0.0.1" })
  yield* server.serve(router.asHttpEffect())
  const port = server.address._tag === "UnixPathAddress" ? 0 : server.address.port
  return { url: `http://127.0.0.1:${port}`, state }
})

/** Waits for `condition`; the bound only ends a wait that will never succeed (5 s was tight on a loaded machine). */
const waitUntil = (condition: () => boolean, timeoutMs = 30_000) =>
  Effect.gen(function* () {
    while (!condition()) yield* Effect.sleep(25)
  }).pipe(Effect.timeout(Duration.millis(timeoutMs)))

const offerCount = defaultFleet.reduce((n, p) => n + p.offers.length, 0)
const keysOf = (state: RouterState) =>
  new Set(state.quotes.map((q) => `${q.quote.provider_id}/${q.quote.model_class}`))

describe("Fleet", () => {
  it.live("registers every provider and keeps posting fresh signed quotes", () =>
    Effect.gen(function* () {
      const stopwatch = startStopwatch()
      const router = yield* fakeRouter
      const { state } = router
      yield* Effect.gen(function* () {
        const fleet = yield* Fleet
        assert.strictEqual(fleet.providers.length, defaultFleet.length)
        yield* waitUntil(() => keysOf(state).size === offerCount)
        assert.strictEqual(state.registrations.length, defaultFleet.length)
        assert.deepStrictEqual(state.unauthorized, [])
        for (const provider of fleet.providers) {
          const registration = state.registry.get(provider.providerId)!
          assert.deepStrictEqual(registration, {
            provider_id: provider.providerId,
            signer: simulationAccount(provider.providerId).address,
            base_url: provider.baseUrl,
            dialect: provider.dialect
          })
          assert.strictEqual(provider.signer, registration.signer)
        }
        // A second round of quotes arrives with fresh ids.
        const firstRound = state.quotes.length
        yield* waitUntil(() => state.quotes.length >= firstRound + offerCount)
        const ids = state.quotes.map((q) => q.quote.quote_id)
        assert.strictEqual(new Set(ids).size, ids.length)
        // A quote is valid for 30 s from when it was drawn and reaches the router within a second of it on
        // an idle machine (plus a second lost to whole-second clocks); a loaded machine stretches that
        // second by the slowdown this thread saw (test/support/Stopwatch.ts).
        const earliest = 29 - Math.ceil(stopwatch.stretch())
        for (const { quote, receivedAt } of state.quotes) {
          const config = defaultFleet.find((p) => p.providerId === quote.provider_id)!
          const offer = config.offers.find((o) => o.modelClass === quote.model_class)!
          const reserve = classReserves[offer.modelClass]
          assert.isAtMost(quote.price_in, reserve.priceIn)
          assert.isAtMost(quote.price_out, reserve.priceOut)
          assert.isAtMost(Math.abs(quote.price_in - offer.priceIn), maxPriceMove(offer.priceIn))
          assert.isAtMost(Math.abs(quote.price_out - offer.priceOut), maxPriceMove(offer.priceOut))
          assert.strictEqual(quote.capacity_rps, config.capacityRps)
          assert.strictEqual(quote.max_context, config.maxContext)
          assert.isAtLeast(quote.valid_until - receivedAt, earliest)
          assert.isAtMost(quote.valid_until - receivedAt, 30)
        }
        assert.strictEqual(state.rejected, 0)
        const stats = yield* fleet.stats
        assert.isAtLeast(stats.cycles, 1)
        assert.strictEqual(stats.quotesRejected, 0)
      }).pipe(
        Effect.provide(
          Fleet.layer({ routerUrl: router.url, operatorToken: Redacted.make(token), refreshMs: 250 })
        )
      )
    }).pipe(Effect.scoped)
  )

  it.live("keeps going while the router is unavailable and registers again when it forgets", () =>
    Effect.gen(function* () {
      const router = yield* fakeRouter
      const { state } = router
      state.available = false
      yield* Effect.gen(function* () {
        const fleet = yield* Fleet
        yield* Effect.sleep(400)
        assert.strictEqual(state.registrations.length, 0)
        state.available = true
        yield* waitUntil(() => keysOf(state).size === offerCount)
        const registrations = state.registrations.length
        state.registry.clear()
        yield* waitUntil(() => state.rejected > 0 && state.registry.size === defaultFleet.length)
        assert.isAbove(state.registrations.length, registrations)
        const before = state.quotes.length
        yield* waitUntil(() => state.quotes.length > before)
        const stats = yield* fleet.stats
        assert.isAbove(stats.quotesRejected, 0)
      }).pipe(
        Effect.provide(
          Fleet.layer({ routerUrl: router.url, operatorToken: Redacted.make(token), refreshMs: 150 })
        )
      )
    }).pipe(Effect.scoped)
  )

  it.live("does not register with a wrong operator token", () =>
    Effect.gen(function* () {
      const router = yield* fakeRouter
      yield* Effect.gen(function* () {
        const fleet = yield* Fleet
        yield* fleet.publishNow
        assert.strictEqual(router.state.registrations.length, 0)
        assert.include(router.state.unauthorized, "Bearer wrong")
        assert.strictEqual(router.state.quotes.length, 0)
      }).pipe(
        Effect.provide(
          Fleet.layer({ routerUrl: router.url, operatorToken: Redacted.make("wrong"), refreshMs: 5_000 })
        )
      )
    }).pipe(Effect.scoped)
  )

  it.live("serves every class of every provider in its own dialect", () =>
    Effect.gen(function* () {
      const router = yield* fakeRouter
      yield* Effect.gen(function* () {
        const fleet = yield* Fleet
        const results = yield* Effect.forEach(
          fleet.providers.flatMap((p) => p.modelClasses.map((model) => ({ p, model }))),
          ({ p, model }) => {
            const messages = [{ role: "user", content: "ping" }]
            return p.dialect === "openai"
              ? postJson(`${p.baseUrl}/v1/chat/completions`, { model, messages, max_tokens: 2 })
              : postJson(`${p.baseUrl}/v1/messages`, { model, messages, max_tokens: 2 })
          },
          { concurrency: "unbounded" }
        )
        assert.deepStrictEqual(
          results.map((r) => r.status),
          results.map(() => 200)
        )
        for (const p of fleet.providers) {
          const counters = yield* p.counters
          const path = p.dialect === "openai" ? "/v1/chat/completions" : "/v1/messages"
          assert.deepStrictEqual(counters.requests, { [path]: p.modelClasses.length })
        }
      }).pipe(
        Effect.provide(
          Fleet.layer({ routerUrl: router.url, operatorToken: Redacted.make(token), refreshMs: 5_000 })
        )
      )
    }).pipe(Effect.scoped)
  )
})
