import { assert, describe, layer } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Schema, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { Instances } from "../../src/db/Instances.ts"
import { quoteSigningString, SignedQuote } from "../../src/domain/Quote.ts"
import { ModelCatalog } from "../../src/market/ModelCatalog.ts"
import { Providers } from "../../src/market/Providers.ts"
import { QuoteBook } from "../../src/market/QuoteBook.ts"
import { elapsedMs } from "../../src/process/ElapsedClock.ts"
import { TestDatabase } from "../support/Database.ts"

const key = privateKeyToAccount(generatePrivateKey())

const BookLayer = QuoteBook.layer.pipe(
  Layer.provideMerge(Providers.layer),
  Layer.provideMerge(Layer.mergeAll(ModelCatalog.layerDefault, Instances.layer)),
  Layer.provideMerge(TestDatabase)
)

const quoteAt = (
  validUntil: number,
  capacity = 2,
  id = `q-${validUntil}-${capacity}`,
  providerId = "prov-clock",
  modelClass = "chat-small"
) =>
  Effect.promise(async () => {
    const unsigned = {
      quote_id: id,
      provider_id: providerId,
      model_class: modelClass,
      price_in: 100_000,
      price_out: 400_000,
      max_context: 32_000,
      valid_until: validUntil,
      capacity_rps: capacity
    }
    const sig = await key.signMessage({ message: quoteSigningString(unsigned as never) })
    return Schema.decodeUnknownSync(SignedQuote)({ ...unsigned, sig })
  })

describe("quote book", () => {
  // it.effect runs on the TestClock: the router's clock starts at 0 and moves only when told.
  layer(BookLayer, { timeout: 60_000 })((it) => {
    it.effect("a quote is live until valid_until and gone after it", () =>
      Effect.gen(function* () {
        const providers = yield* Providers
        const book = yield* QuoteBook
        yield* providers.register({
          provider_id: "prov-clock",
          signer: key.address,
          base_url: "http://127.0.0.1:9",
          dialect: "openai"
        })
        yield* TestClock.setTime(1_000_000)
        yield* book.ingest(yield* quoteAt(1_000 + 30))
        assert.strictEqual((yield* book.live).length, 1)
        yield* TestClock.adjust("29 seconds")
        assert.strictEqual((yield* book.live).length, 1)
        yield* TestClock.adjust("2 seconds")
        assert.strictEqual((yield* book.live).length, 0)
      })
    )

    it.effect(
      "the book numbers each provider once: quotes share a number exactly when they share a provider",
      () =>
        Effect.gen(function* () {
          const providers = yield* Providers
          const book = yield* QuoteBook
          for (const provider_id of ["prov-n1", "prov-n2", "prov-n3"])
            yield* providers.register({
              provider_id,
              signer: key.address,
              base_url: "http://127.0.0.1:9",
              dialect: "openai"
            })
          yield* TestClock.setTime(2_000_000)
          const until = 2_000 + 30
          yield* book.ingest(yield* quoteAt(until, 2, "qn-1", "prov-n1", "chat-small"))
          yield* book.ingest(yield* quoteAt(until, 2, "qn-2", "prov-n2", "chat-small"))
          yield* book.ingest(yield* quoteAt(until, 2, "qn-3", "prov-n1", "chat-medium"))
          yield* book.ingest(yield* quoteAt(until, 2, "qn-4", "prov-n3", "chat-large"))
          // A newer standing quote replaces the provider's first one and keeps its number.
          yield* book.ingest(yield* quoteAt(until + 5, 2, "qn-5", "prov-n1", "chat-small"))
          const live = (yield* book.live).filter((q) => q.quote.quote_id.startsWith("qn-"))
          assert.deepStrictEqual(
            live.map((q) => q.quote.quote_id),
            ["qn-2", "qn-3", "qn-4", "qn-5"]
          )
          for (const a of live)
            for (const b of live) {
              assert.isTrue(Number.isInteger(a.provider) && a.provider! >= 0)
              assert.strictEqual(a.provider === b.provider, a.quote.provider_id === b.quote.provider_id)
            }
        })
    )

    it.effect("capacity is a scoped slot: the ceiling holds and a failed request releases its slot", () =>
      Effect.gen(function* () {
        const book = yield* QuoteBook
        yield* TestClock.setTime(2_000_000)
        const quote = yield* quoteAt(2_000 + 30, 1, "q-capacity")
        yield* book.ingest(quote)
        const held = yield* Scope.make()
        yield* book.acquireSlot(quote).pipe(Scope.provide(held))
        assert.strictEqual((yield* book.live)[0]!.inFlight, 1)
        const second = yield* Effect.exit(Effect.scoped(book.acquireSlot(quote)))
        assert.isTrue(Exit.isFailure(second), "second request must not exceed capacity_rps = 1")
        yield* Scope.close(held, Exit.void)
        assert.strictEqual((yield* book.live)[0]!.inFlight, 0)
        // A request that fails after taking its slot gives it back.
        const failed = yield* Effect.exit(
          Effect.scoped(Effect.andThen(book.acquireSlot(quote), Effect.fail("provider error")))
        )
        assert.isTrue(Exit.isFailure(failed))
        assert.strictEqual((yield* book.live)[0]!.inFlight, 0)
        yield* Effect.scoped(book.acquireSlot(quote))
      })
    )
    it.effect("a request interrupted while it takes its slot leaves no lease behind", () =>
      TestClock.withLive(
        Effect.gen(function* () {
          const book = yield* QuoteBook
          const sql = yield* SqlClient.SqlClient
          const quote = yield* quoteAt(Math.floor(Date.now() / 1000) + 30, 1_000, "q-interrupted")
          yield* book.ingest(quote)
          // A caller hanging up 0–4 ms in lands before, during and after the lease's own statement.
          for (let i = 0; i < 60; i++) {
            const fiber = yield* Effect.forkChild(
              Effect.scoped(Effect.andThen(book.acquireSlot(quote), Effect.never))
            )
            yield* Effect.sleep(i % 5)
            yield* Fiber.interrupt(fiber)
          }
          const left = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM capacity_leases`
          assert.strictEqual(left[0]!.n, 0)
          assert.strictEqual(
            (yield* book.live).find((q) => q.quote.quote_id === "q-interrupted")!.inFlight,
            0
          )
        })
      )
    )
  })

  // This instance's heartbeat, as the book reads it (D557): a survivor may release the rows of an instance
  // silent for too long, so a warm lease written before such a gap must not be reused.
  const beats = { steadySince: 0 }
  const GappyLayer = QuoteBook.layer.pipe(
    Layer.provideMerge(Providers.layer),
    Layer.provideMerge(ModelCatalog.layerDefault),
    Layer.provideMerge(
      Layer.succeed(
        Instances,
        Instances.of({
          self: "i_gappy",
          deadAfterSeconds: 30,
          dead: Effect.succeed([]),
          releaseLeases: () => Effect.succeed(0),
          leftByDead: () => {
            throw new Error("not read by the book")
          },
          markSettled: () => Effect.void,
          steadySince: () => beats.steadySince
        })
      )
    ),
    Layer.provideMerge(TestDatabase)
  )
  const leaseRows = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ lease_id: string }>`SELECT lease_id FROM capacity_leases ORDER BY lease_id`
    return rows.map((r) => r.lease_id)
  })

  // On the real clock: the give-back pass runs every 100 ms of it, and leases age by the wall clock.
  layer(GappyLayer, { timeout: 60_000, excludeTestServices: true })((it) => {
    it.effect("a warm lease written before a gap in the heartbeat is given back, never reused (D557)", () =>
      Effect.gen(function* () {
        const book = yield* QuoteBook
        yield* (yield* Providers).register({
          provider_id: "prov-gappy",
          signer: key.address,
          base_url: "http://127.0.0.1:9",
          dialect: "openai"
        })
        const quote = yield* quoteAt(Math.floor(Date.now() / 1000) + 30, 1, "q-gappy", "prov-gappy")
        yield* book.ingest(quote)
        // A request whose settling statement left its row: the lease goes warm and the next one takes it.
        const served = Effect.scoped(
          Effect.map(book.acquireSlot(quote), (slot) => ({ leaseId: slot.leaseId, ends: slot.endsWith() }))
        )
        const first = yield* served
        assert.isUndefined(first.ends)
        assert.isTrue(book.hasWarm(quote))
        const second = yield* served
        assert.strictEqual(second.leaseId, first.leaseId)
        assert.deepStrictEqual(yield* leaseRows, [first.leaseId])

        // A gap: the idle lease goes (its row deleted by the next pass), and none is kept meanwhile.
        beats.steadySince = Number.POSITIVE_INFINITY
        assert.isFalse(book.hasWarm(quote))
        // The next give-back pass (every 100 ms) deletes it.
        yield* Effect.sleep("250 millis")
        assert.deepStrictEqual(yield* leaseRows, [])
        const during = yield* served
        assert.notStrictEqual(during.leaseId, first.leaseId)
        assert.strictEqual(during.ends, during.leaseId, "the settling statement ends a lease taken in a gap")
        assert.deepStrictEqual(yield* leaseRows, [])

        // Steady again from now: a lease written since goes warm; one written before the gap ended does not.
        const held = yield* Scope.make()
        const before = yield* book.acquireSlot(quote).pipe(Scope.provide(held))
        yield* Effect.sleep("5 millis")
        beats.steadySince = elapsedMs()
        assert.strictEqual(before.endsWith(), before.leaseId)
        yield* Scope.close(held, Exit.void)
        assert.deepStrictEqual(yield* leaseRows, [])
        const after = yield* served
        assert.isUndefined(after.ends)
        assert.deepStrictEqual(yield* leaseRows, [after.leaseId])
        assert.strictEqual((yield* served).leaseId, after.leaseId)
      })
    )
  })
})
