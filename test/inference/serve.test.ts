import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Schema, Scope, Stream } from "effect"
import { charge } from "../../src/domain/Billing.ts"
import { ServiceUnavailable, UpstreamFailed } from "../../src/domain/Errors.ts"
import { SignedQuote } from "../../src/domain/Quote.ts"
import type { UpstreamEvent } from "../../src/inference/Events.ts"
import { LiveStreams } from "../../src/inference/LiveStreams.ts"
import type { Launch, ServeEvent } from "../../src/inference/Paid.ts"
import { Serve } from "../../src/inference/Serve.ts"
import { Upstream } from "../../src/inference/upstream/Upstream.ts"
import { UpstreamError } from "../../src/inference/upstream/UpstreamError.ts"
import { type Served, Settle } from "../../src/ledger/Settle.ts"
import { type AuctionCleared, runAuction } from "../../src/market/Auction.ts"
import { defaultCatalog } from "../../src/market/Catalog.ts"
import { Latency } from "../../src/market/Latency.ts"
import { Providers } from "../../src/market/Providers.ts"
import { leaseRequestOf, QuoteBook } from "../../src/market/QuoteBook.ts"

/**
 * The serve step on its own, with stand-ins for everything around it: a fixed book and registry, a
 * scripted upstream per provider, and a settlement that records instead of writing the ledger.
 */

const NOW_S = Math.floor(Date.now() / 1000)

const quote = (provider: string, priceIn: number, priceOut: number, capacity = 4) =>
  Schema.decodeUnknownSync(SignedQuote)({
    quote_id: `q-${provider}`,
    provider_id: provider,
    model_class: "chat-medium",
    price_in: priceIn,
    price_out: priceOut,
    max_context: 128_000,
    valid_until: NOW_S + 3600,
    capacity_rps: capacity,
    sig: `0x${"ab".repeat(65)}`
  })

const provider = (id: string) => ({
  provider_id: id,
  signer: "0x0000000000000000000000000000000000000001",
  base_url: `http://${id}.test`,
  dialect: "openai" as const,
  enabled: true
})

const reply = (text: ReadonlyArray<string>, usage = { inputTokens: 20, outputTokens: text.length }) =>
  Stream.fromIterable<UpstreamEvent>([
    ...text.map((t) => ({ _tag: "TextDelta" as const, text: t })),
    { _tag: "Finish", reason: "stop" },
    { _tag: "Usage", ...usage }
  ])

const fails = Stream.fail(
  new UpstreamError({ reason: "http_status", message: "upstream answered 500", status: 500 })
)

/** How each provider answers, by the base URL the serve step calls. */
type Script = Record<string, Stream.Stream<UpstreamEvent, UpstreamError>>

const layerFor = (script: Script, settled: Array<Served>, capacity = 4, deadlineMs?: number) =>
  Serve.layerWith({ deadlineMs }).pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        QuoteBook.layerTest([quote("prov-a", 100, 400, capacity), quote("prov-b", 110, 440, capacity)]),
        Providers.layerTest([provider("prov-a"), provider("prov-b")]),
        Upstream.layerTest((target) => script[target.baseUrl] ?? fails),
        Settle.layerTest((served) => Effect.sync(() => settled.push(served))),
        LiveStreams.layer,
        Latency.layer
      )
    )
  )

const auction = (): AuctionCleared => {
  const outcome = runAuction(
    { requested: "chat-medium", promptTokens: 20, maxTokens: 64, nowMs: NOW_S * 1000 },
    [quote("prov-a", 100, 400), quote("prov-b", 110, 440)].map((q) => ({ quote: q, inFlight: 0 })),
    defaultCatalog,
    () => ({ quantile: () => 300, maturity: "mature" })
  )
  assert.strictEqual(outcome._tag, "Cleared")
  return outcome as AuctionCleared
}

const launch = (cleared: AuctionCleared): Launch => ({
  requestId: `req_${Math.random().toString(16).slice(2)}`,
  createdAt: NOW_S * 1000,
  request: { model: "chat-medium", messages: [{ role: "user", content: "hi" }], max_tokens: 64 },
  auction: cleared,
  payer: "0xPAYER",
  funding: { _tag: "Credit", keyId: "key_1", wallet: "0xpayer", keyRemaining: 0 },
  source: { _tag: "Credit", keyId: "key_1" },
  authorized: cleared.clearedCost,
  promptEstimate: 20,
  cachedEstimate: 0,
  sessionToken: undefined,
  agent: {}
})

/** As the pipeline does: the launch reserved in a scope of its own, which the serving fiber then owns. */
const reserveAndLaunch = (funded: Launch) =>
  Effect.gen(function* () {
    const serve = yield* Serve
    const scope = yield* Scope.make()
    const reservation = yield* serve.reserve(Effect.succeed(funded)).pipe(Scope.provide(scope))
    return yield* serve.launch(reservation, scope)
  })

const readAll = (events: ReadonlyArray<ServeEvent>) =>
  events.flatMap((e) => (e._tag === "Delta" && e.event._tag === "TextDelta" ? [e.event.text] : [])).join("")

/** Once the readers were told the end, the work may still be settling (D534): waits for its end. */
const settledWork = (admitted: { readonly requestId: string }) =>
  Effect.flatMap(Effect.service(LiveStreams), (live) => live.awaitDone(admitted.requestId, 5_000))

/** A request served to its end: the events a reader from the start gets, once its work has settled. */
const servedEvents = Effect.gen(function* () {
  const admitted = yield* reserveAndLaunch(launch(auction()))
  const events = yield* Effect.map(Stream.runCollect((yield* LiveStreams).follow(admitted.stream, 0)), (c) =>
    c.map((i) => i.event)
  )
  yield* settledWork(admitted)
  return events
})

const deltaTags = (events: ReadonlyArray<ServeEvent>) =>
  events.flatMap((e) => (e._tag === "Delta" ? [e.event._tag] : []))

const source = { id: "s1", title: "A source", url: "https://a.example/1", snippet: "…" }

describe("Serve", () => {
  it.effect("streams the winner's reply and settles what it metered, once", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const cleared = auction()
      const admitted = yield* reserveAndLaunch(launch(cleared))
      const events = yield* Effect.map(
        Stream.runCollect((yield* LiveStreams).follow(admitted.stream, 0)),
        (c) => c.map((i) => i.event)
      )
      yield* settledWork(admitted)
      assert.strictEqual(readAll(events), "Hello there")
      const end = events.at(-1)
      assert.isTrue(end?._tag === "End" && end.summary.status === "ok")
      assert.strictEqual(settled.length, 1)
      const served = settled[0]!
      assert.strictEqual(served.servedBy.provider_id, "prov-a")
      assert.strictEqual(served.status, "ok")
      assert.deepStrictEqual(served.tokens, { input: 20, cachedInput: 0, output: 2 })
      assert.strictEqual(served.charged, charge(served.tokens, cleared.clear))
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": reply(["Hello", " there"]) }, settled)))
  })

  it.effect("a reader that throws on the end does not cost the request its settlement (D534)", () => {
    const settled: Array<Served> = []
    // The reply waits after its first token until the faulty reader has joined.
    const joined = Deferred.makeUnsafe<void>()
    const gated = Stream.concat(
      Stream.fromIterable<UpstreamEvent>([{ _tag: "TextDelta", text: "Hello" }]),
      Stream.concat(Stream.drain(Stream.fromEffect(Deferred.await(joined))), reply([" there"]))
    )
    return Effect.gen(function* () {
      const admitted = yield* reserveAndLaunch(launch(auction()))
      // A key-paid answer tells its readers the end before its settling statement: an encoder that throws
      // there is contained, and the statement still runs.
      const faulty = (yield* LiveStreams).follow(admitted.stream, 0, {
        map: (indexed) => {
          if (indexed.event._tag === "End") throw new Error("an encoder's bug")
          return indexed.event
        }
      })
      const draining = yield* Effect.forkChild(Stream.runDrain(faulty))
      yield* Effect.repeat(Effect.yieldNow, { times: 5 })
      yield* Deferred.succeed(joined, undefined)
      yield* Fiber.join(draining)
      yield* settledWork(admitted)
      assert.strictEqual(settled.length, 1)
      assert.strictEqual(settled[0]!.status, "ok")
      assert.isAbove(settled[0]!.charged, 0)
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": gated }, settled)))
  })

  it.effect("falls back to the runner-up when the winner fails before its first token", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const admitted = yield* reserveAndLaunch(launch(auction()))
      yield* Stream.runDrain((yield* LiveStreams).follow(admitted.stream, 0))
      yield* settledWork(admitted)
      assert.strictEqual(settled.length, 1)
      assert.strictEqual(settled[0]!.servedBy.provider_id, "prov-b")
      assert.strictEqual(settled[0]!.status, "ok")
    }).pipe(Effect.provide(layerFor({ "http://prov-b.test": reply(["Fallback"]) }, settled)))
  })

  // D565: a read's events are handled in one step; grounding is held until a token proves its provider serving.
  it.effect("grounding in the same read as the first token goes out before it, once", () => {
    const settled: Array<Served> = []
    const grounded = Stream.fromIterable<UpstreamEvent>([
      { _tag: "Sources", sources: [source] },
      { _tag: "TextDelta", text: "Grounded" },
      { _tag: "TextDelta", text: " reply" },
      { _tag: "Finish", reason: "stop" },
      { _tag: "Usage", inputTokens: 20, outputTokens: 2 }
    ])
    return Effect.gen(function* () {
      const events = yield* servedEvents
      assert.deepStrictEqual(deltaTags(events), ["Sources", "TextDelta", "TextDelta"])
      assert.strictEqual(readAll(events), "Grounded reply")
      assert.deepStrictEqual(settled[0]!.tokens, { input: 20, cachedInput: 0, output: 2 })
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": grounded }, settled)))
  })

  it.effect(
    "a winner's grounding is not repeated when it fails before its first token and the runner-up serves",
    () => {
      const settled: Array<Served> = []
      const groundedThenFails = Stream.concat(
        Stream.fromIterable<UpstreamEvent>([{ _tag: "Sources", sources: [source] }]),
        fails
      )
      return Effect.gen(function* () {
        assert.deepStrictEqual(deltaTags(yield* servedEvents), ["TextDelta"])
        assert.strictEqual(settled[0]!.servedBy.provider_id, "prov-b")
      }).pipe(
        Effect.provide(
          layerFor(
            { "http://prov-a.test": groundedThenFails, "http://prov-b.test": reply(["Fallback"]) },
            settled
          )
        )
      )
    }
  )

  it.effect("when nobody serves: a 502 to the caller and the whole reservation released", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const exit = yield* Effect.exit(reserveAndLaunch(launch(auction())))
      assert.isTrue(Exit.isFailure(exit))
      const error = Exit.isFailure(exit)
        ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error
        : undefined
      assert.instanceOf(error, UpstreamFailed)
      assert.strictEqual(settled.length, 1)
      assert.deepStrictEqual([settled[0]!.status, settled[0]!.charged], ["released", 0])
    }).pipe(Effect.provide(layerFor({}, settled)))
  })

  it.effect("every candidate at its signed capacity is a busy market (503), not a provider fault", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const book = yield* QuoteBook
      // Other requests hold every slot of both quotes.
      for (const { quote } of yield* book.live) yield* book.acquireSlot(quote)
      const exit = yield* Effect.exit(reserveAndLaunch(launch(auction())))
      const error = Exit.isFailure(exit)
        ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error
        : undefined
      assert.instanceOf(error, ServiceUnavailable)
      assert.strictEqual((error as ServiceUnavailable).code, "capacity_exhausted")
      assert.strictEqual(settled[0]?.status, "released")
    }).pipe(Effect.scoped, Effect.provide(layerFor({ "http://prov-a.test": reply(["x"]) }, settled, 1)))
  })

  it.effect("the winner serves on the lease its reservation took, and no slot of its own (D311)", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const book = yield* QuoteBook
      const cleared = auction()
      const lease = leaseRequestOf(cleared.winningQuote)
      const admitted = yield* reserveAndLaunch({ ...launch(cleared), lease: { lease, granted: true } })
      yield* Stream.runDrain((yield* LiveStreams).follow(admitted.stream, 0))
      yield* settledWork(admitted)
      // The winner's one slot of capacity is the reservation's: a second slot would be refused.
      assert.deepStrictEqual(
        [settled[0]?.servedBy.provider_id, settled[0]?.status, settled[0]?.lease],
        ["prov-a", "ok", lease.leaseId]
      )
      // Held until settled, then let go.
      assert.deepStrictEqual(
        (yield* book.live).map((q) => q.inFlight),
        [0, 0]
      )
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": reply(["Leased"]) }, settled, 1)))
  })

  it.effect(
    "a lease the reservation was refused (the winner at its ceiling) falls back as a full slot would",
    () => {
      const settled: Array<Served> = []
      return Effect.gen(function* () {
        const book = yield* QuoteBook
        // Another request holds prov-a's one slot, so asking its ceiling again is refused too.
        const winner = (yield* book.live).find((q) => q.quote.provider_id === "prov-a")!
        yield* book.acquireSlot(winner.quote)
        const cleared = auction()
        const lease = leaseRequestOf(cleared.winningQuote)
        const admitted = yield* reserveAndLaunch({ ...launch(cleared), lease: { lease, granted: false } })
        yield* Stream.runDrain((yield* LiveStreams).follow(admitted.stream, 0))
        yield* settledWork(admitted)
        assert.deepStrictEqual([settled[0]?.servedBy.provider_id, settled[0]?.status], ["prov-b", "ok"])
        assert.notStrictEqual(settled[0]?.lease, lease.leaseId)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          layerFor(
            { "http://prov-a.test": reply(["Winner"]), "http://prov-b.test": reply(["Runner-up"]) },
            settled,
            1
          )
        )
      )
    }
  )

  it.effect(
    "a refused lease asks the winner's ceiling once more: a slot freed since serves the winner (D555)",
    () => {
      const settled: Array<Served> = []
      return Effect.gen(function* () {
        const book = yield* QuoteBook
        const cleared = auction()
        const lease = leaseRequestOf(cleared.winningQuote)
        // The statement found prov-a full, but its slot was let go before the attempt ran.
        const admitted = yield* reserveAndLaunch({ ...launch(cleared), lease: { lease, granted: false } })
        yield* Stream.runDrain((yield* LiveStreams).follow(admitted.stream, 0))
        yield* settledWork(admitted)
        assert.deepStrictEqual([settled[0]?.servedBy.provider_id, settled[0]?.status], ["prov-a", "ok"])
        assert.notStrictEqual(settled[0]?.lease, lease.leaseId)
        assert.deepStrictEqual(
          (yield* book.live).map((q) => q.inFlight),
          [0, 0]
        )
      }).pipe(
        Effect.provide(
          layerFor(
            { "http://prov-a.test": reply(["Winner"]), "http://prov-b.test": reply(["Runner-up"]) },
            settled,
            1
          )
        )
      )
    }
  )

  it.effect("a reply broken after its first token ends partial, charging what was delivered", () => {
    const settled: Array<Served> = []
    const broken = Stream.concat(
      Stream.fromIterable<UpstreamEvent>([{ _tag: "TextDelta", text: "Half" }]),
      Stream.fail(new UpstreamError({ reason: "dropped", message: "the body broke off" }))
    )
    return Effect.gen(function* () {
      const admitted = yield* reserveAndLaunch(launch(auction()))
      yield* Stream.runDrain((yield* LiveStreams).follow(admitted.stream, 0))
      yield* settledWork(admitted)
      assert.strictEqual(settled.length, 1)
      const served = settled[0]!
      assert.strictEqual(served.status, "partial")
      assert.strictEqual(served.servedBy.provider_id, "prov-a")
      assert.isAbove(served.charged, 0)
      assert.isTrue(served.tokens.output >= 1)
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": broken }, settled)))
  })

  it.live("a request still serving at its deadline ends partial, charged what was delivered, once", () => {
    const settled: Array<Served> = []
    // One token, then a provider that never finishes.
    const endless = Stream.concat(
      Stream.fromIterable<UpstreamEvent>([{ _tag: "TextDelta", text: "Slow" }]),
      Stream.never
    )
    return Effect.gen(function* () {
      const started = Date.now()
      const admitted = yield* reserveAndLaunch(launch(auction()))
      const events = yield* Effect.map(
        Stream.runCollect((yield* LiveStreams).follow(admitted.stream, 0)),
        (c) => c.map((i) => i.event)
      )
      yield* settledWork(admitted)
      assert.isAtLeast(Date.now() - started, 250)
      assert.strictEqual(readAll(events), "Slow")
      const end = events.at(-1)
      assert.isTrue(end?._tag === "End", JSON.stringify(end))
      if (end?._tag !== "End") return
      assert.strictEqual(end.summary.status, "partial")
      assert.strictEqual(end.summary.error?.code, "serve_deadline")
      assert.strictEqual(settled.length, 1)
      assert.strictEqual(settled[0]!.status, "partial")
      assert.isAbove(settled[0]!.charged, 0)
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": endless }, settled, 4, 300)))
  })

  it.live("a request with no token by its deadline is a 502 naming the deadline, released whole", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const exit = yield* Effect.exit(reserveAndLaunch(launch(auction())))
      const error = Exit.isFailure(exit)
        ? exit.cause.reasons.find((r) => r._tag === "Fail")?.error
        : undefined
      assert.instanceOf(error, UpstreamFailed)
      assert.strictEqual((error as UpstreamFailed).code, "serve_deadline")
      assert.deepStrictEqual(
        settled.map((s) => [s.status, s.charged]),
        [["released", 0]]
      )
    }).pipe(Effect.provide(layerFor({ "http://prov-a.test": Stream.never }, settled, 4, 300)))
  })

  it.effect("a reservation whose scope closes before it is served is released whole, once", () => {
    const settled: Array<Served> = []
    return Effect.gen(function* () {
      const serve = yield* Serve
      const scope = yield* Scope.make()
      // Admission succeeded (the reservation is written) and then the request failed before serving.
      const reservation = yield* serve.reserve(Effect.succeed(launch(auction()))).pipe(Scope.provide(scope))
      yield* Scope.close(scope, Exit.fail("refused after funding"))
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(
        settled.map((s) => [s.requestId, s.status, s.charged]),
        [[reservation.requestId, "released", 0]]
      )
    }).pipe(Effect.provide(layerFor({}, settled)))
  })
})
