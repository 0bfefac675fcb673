import { assert, describe, layer } from "@effect/vitest"
import { SpanKind } from "@opentelemetry/api"
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import type { ProviderConfig } from "../../src/devnet/fleet/FleetConfig.ts"
import { tracingWith } from "../../src/Telemetry.ts"
import { fundedKey } from "../support/Keys.ts"
import { payer, waitForQuote } from "../support/Pay.ts"
import { postJson, RouterUrl, routerWithFleet } from "../support/Router.ts"

/**
 * Issue 12 item 3: what a paid credit-key request costs the database. Every SQL statement the
 * router runs is a span (effect/sql), and a transaction adds its BEGIN and COMMIT: counted over the
 * request's own trace (the reply and the serving fiber; background passes such as the receipt signer
 * are traces of their own), a regression in round trips fails here.
 */
const exporter = new InMemorySpanExporter()

const provider: ProviderConfig = {
  providerId: "rt-1",
  dialect: "openai",
  offers: [{ modelClass: "chat-small", priceIn: 100_000, priceOut: 400_000 }],
  ttftMs: 0,
  tokensPerSecond: 100_000,
  capacityRps: 64,
  maxContext: 32_000
}

const router = routerWithFleet({}, [provider]).pipe(
  Layer.provide(tracingWith([new SimpleSpanProcessor(exporter)]))
)

const isStatement = (span: ReadableSpan) =>
  span.kind === SpanKind.CLIENT && typeof span.attributes["db.query.text"] === "string"

/** Round trips of one trace: each statement, and BEGIN and COMMIT of each transaction. */
const costOf = (spans: ReadonlyArray<ReadableSpan>) => {
  const statements = spans.filter(isStatement).map((s) => String(s.attributes["db.query.text"]))
  const transactions = spans.filter((s) => s.name === "sql.transaction").length
  const updates = (table: string) =>
    statements.filter((text) => new RegExp(`UPDATE\\s+${table}\\b`, "i").test(text)).length
  return {
    statements,
    roundTrips: statements.length + 2 * transactions,
    keyUpdates: updates("api_keys"),
    walletUpdates: updates("wallet_balances")
  }
}

/**
 * Whether a statement reads a queue table itself: the leases, the slots and the unfolded captures are read only
 * through their functions, whose plans probe the indexes however small the tables were when planned (D553).
 */
const readsQueueTable = (text: string) =>
  /\b(FROM|JOIN|UPDATE)\s+(capacity_leases|capacity_slots|credit_unfolded)\b/i.test(text)

/** The capacity leases left once a warm lease has had time to be given back (250 ms idle, D555). */
const leasesOnceIdle = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* Effect.sleep("600 millis")
  const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM capacity_leases`.pipe(Effect.orDie)
  return rows[0]!.n
})

const paidCall = (key: string) =>
  postJson(
    "/v1/chat/completions",
    { model: "chat-small", messages: [{ role: "user", content: "count my round trips" }], max_tokens: 16 },
    { "x-credit-key": key }
  )

describe("the paid credit-key path's database cost", () => {
  layer(router, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("at most two round trips, none of them a transaction, and eleven spans", () =>
      Effect.gen(function* () {
        yield* waitForQuote("chat-small")
        const key = yield* fundedKey({ budget: 100_000_000, balance: 100_000_000 })
        // Warm: prepared statements, the connection pool, the quote book.
        const warm = yield* paidCall(key.secret)
        assert.strictEqual(warm.status, 200, warm.text)
        yield* Effect.sleep("200 millis")
        exporter.reset()

        const reply = yield* paidCall(key.secret)
        assert.strictEqual(reply.status, 200, reply.text)
        yield* Effect.sleep("300 millis")
        const spans = exporter.getFinishedSpans()
        // The paid call's trace (the fleet's quote posts are traces of their own).
        const paid = spans.find((s) => s.name === "Completions.admit")
        assert.isDefined(paid, `spans: ${spans.map((s) => s.name).join(", ")}`)
        const trace = spans.filter((s) => s.spanContext().traceId === paid!.spanContext().traceId)
        const cost = costOf(trace)
        const listing = cost.statements.map((s) => s.replace(/\s+/g, " ").slice(0, 90)).join("\n  ")
        // The reservation (which resolves the key, and takes the capacity lease when none is warm, D311) and
        // the capture (which deletes the lease unless it stays warm, D555): two, from five (key resolution,
        // the lease and its release were round trips of their own).
        assert.isAtMost(cost.roundTrips, 2, `round trips:\n  ${listing}`)
        assert.isFalse(
          cost.statements.some((text) =>
            /^\s*(SELECT k\.key_id|DELETE FROM capacity_leases|SELECT acquire_capacity)/i.test(text)
          ),
          `no key lookup, lease or lease delete of its own:\n  ${listing}`
        )
        assert.isFalse(cost.statements.some(readsQueueTable), `a queue table read as planned:\n  ${listing}`)
        assert.strictEqual(trace.filter((s) => s.name === "sql.transaction").length, 0)
        // The router's own spans (the simulated provider's, in the same trace, are not the router's):
        // the request, admission, the auction, the upstream call, serving, settling, and one per
        // statement (33 before issue 12, one per internal function, each with a stack trace; the capacity
        // slot's span went with its statement, D311).
        const providerSide = (s: ReadableSpan) =>
          s.name.startsWith("ProviderServer.") ||
          (s.kind === SpanKind.SERVER && s.parentSpanContext !== undefined)
        const routerSpans = trace.filter((s) => !providerSide(s))
        assert.isAtMost(routerSpans.length, 11, routerSpans.map((s) => s.name).join(", "))
        // The key and its owner's balance: once each, when reserving; the capture queues the request for
        // the background fold (D315), which is a trace of its own.
        assert.strictEqual(cost.keyUpdates, 1, `key updates:\n  ${listing}`)
        assert.strictEqual(cost.walletUpdates, 1, `balance updates:\n  ${listing}`)
      })
    )

    it.effect("an x402 request takes its capacity lease in its reservation's statement too", () =>
      Effect.gen(function* () {
        yield* waitForQuote("chat-small")
        const url = yield* RouterUrl
        const { payingFetch } = yield* payer(1)
        const paidX402 = Effect.promise(async () => {
          const response = await payingFetch(`${url}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({
              model: "chat-small",
              messages: [{ role: "user", content: "count my round trips" }],
              max_tokens: 16
            })
          })
          return { status: response.status, text: await response.text() }
        })
        const warm = yield* paidX402
        assert.strictEqual(warm.status, 200, warm.text)
        // Long enough for the warm call's lease to be given back (D555): this call takes its own.
        assert.strictEqual(yield* leasesOnceIdle, 0)
        exporter.reset()
        const reply = yield* paidX402
        assert.strictEqual(reply.status, 200, reply.text)
        yield* Effect.sleep("300 millis")
        const spans = exporter.getFinishedSpans()
        // The paid retry's trace: the one that reserved.
        const reserved = spans.find((s) => s.name === "Ledger.reserveX402")
        assert.isDefined(reserved, `spans: ${spans.map((s) => s.name).join(", ")}`)
        const trace = spans.filter((s) => s.spanContext().traceId === reserved!.spanContext().traceId)
        const { statements } = costOf(trace)
        const listing = statements.map((s) => s.replace(/\s+/g, " ").slice(0, 90)).join("\n  ")
        assert.isFalse(
          statements.some((text) => /^\s*SELECT acquire_capacity/i.test(text)),
          `no lease statement of its own:\n  ${listing}`
        )
        assert.isFalse(statements.some(readsQueueTable), `a queue table read as planned:\n  ${listing}`)
        assert.isTrue(
          statements.some((text) => /INSERT INTO x402_authorizations[\s\S]*acquire_capacity/i.test(text)),
          `the reservation takes the lease:\n  ${listing}`
        )
      })
    )

    it.effect(
      "back-to-back calls share one warm lease, taken and given back by no statement of their own (D555)",
      () =>
        Effect.gen(function* () {
          yield* waitForQuote("chat-small")
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 100_000_000, balance: 100_000_000 })
          assert.strictEqual(yield* leasesOnceIdle, 0)
          const first = yield* paidCall(key.secret)
          assert.strictEqual(first.status, 200, first.text)
          // The first call's lease row stays, idle, for the next one (once its settlement ran: the reply
          // goes out before it, D534).
          yield* Effect.sleep("50 millis")
          const held = yield* sql<{ lease_id: string }>`SELECT lease_id FROM capacity_leases`.pipe(
            Effect.orDie
          )
          assert.strictEqual(held.length, 1)
          // 200 ms idle, then the second call; 150 ms after it the row is there only if that call took it
          // over and put it back: left idle since the first call, it would have been given back by then
          // (250 ms idle, a pass every 100 ms).
          yield* Effect.sleep("150 millis")
          exporter.reset()
          const second = yield* paidCall(key.secret)
          assert.strictEqual(second.status, 200, second.text)
          yield* Effect.sleep("150 millis")
          const after = yield* sql<{ lease_id: string }>`SELECT lease_id FROM capacity_leases`.pipe(
            Effect.orDie
          )
          assert.deepStrictEqual(after, held, "the second call served on the first call's lease")
          const spans = exporter.getFinishedSpans()
          const paid = spans.find((s) => s.name === "Completions.admit")
          assert.isDefined(paid)
          const { statements } = costOf(
            spans.filter((s) => s.spanContext().traceId === paid!.spanContext().traceId)
          )
          const listing = statements.map((s) => s.replace(/\s+/g, " ").slice(0, 90)).join("\n  ")
          assert.isFalse(
            statements.some((text) => /^\s*SELECT (acquire_capacity|capacity_release)/i.test(text)),
            `no lease taken or given back on the call's path:\n  ${listing}`
          )
          // And once nothing asks for it, it goes back to every instance.
          assert.strictEqual(yield* leasesOnceIdle, 0)
        })
    )
  })
})
