import { assert, describe, layer } from "@effect/vitest"
import { SpanKind } from "@opentelemetry/api"
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { ConfigProvider, Effect, Layer } from "effect"
import type { Address, Hash } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { databaseFromUrl } from "../../src/db/Database.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { tracingWith } from "../../src/Telemetry.ts"
import { countedChain } from "../support/CountingRpc.ts"
import { freshDatabaseUrl } from "../support/Database.ts"
import { fundTreasury } from "./support.ts"

/**
 * Issue 12 (sends): what one outgoing transfer costs the database and the node once its sender is known
 * (every settlement of an x402 authorization is one). Every statement is a span (effect/sql), counted
 * over the send's own trace: a regression in statements fails here.
 */
const exporter = new InMemorySpanExporter()

const Database = Layer.unwrap(Effect.map(freshDatabaseUrl, databaseFromUrl))
// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const EmbeddedChain = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

const isStatement = (span: ReadableSpan) =>
  span.kind === SpanKind.CLIENT && typeof span.attributes["db.query.text"] === "string"

/** The statements of the trace `root` names, in order. */
const statementsOf = (root: string) => {
  const spans = exporter.getFinishedSpans()
  const top = spans.filter((s) => s.name === root).at(-1)
  assert.isDefined(top, `spans: ${spans.map((s) => s.name).join(", ")}`)
  const trace = spans.filter((s) => s.spanContext().traceId === top!.spanContext().traceId)
  return {
    statements: trace.filter(isStatement).map((s) => String(s.attributes["db.query.text"])),
    transactions: trace.filter((s) => s.name === "sql.transaction").length
  }
}

const freshAddress = (): Address => privateKeyToAccount(generatePrivateKey()).address

describe("one outgoing transfer's cost (issue 12, sends)", () => {
  layer(Layer.mergeAll(Database, EmbeddedChain, tracingWith([new SimpleSpanProcessor(exporter)])), {
    excludeTestServices: true,
    timeout: 120_000
  })((it) => {
    it.effect(
      "a send of a known sender: five statements, one transaction, and two RPCs besides the cached fee estimate",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          // Every JSON-RPC call the treasury's sends make, read from the requests they POST.
          const counted = countedChain(yield* Chain)
          const treasury = yield* Treasury.make().pipe(Effect.provideService(Chain, counted.chain))
          // The first send writes the sender's row and asks the node for its count.
          const first = yield* treasury.send({
            _tag: "Withdrawal",
            withdrawalId: "cost_0",
            to: freshAddress(),
            amount: 1n
          })
          yield* treasury.confirm(first as Hash)
          exporter.reset()
          counted.requests.length = 0
          const hash = yield* treasury.send({
            _tag: "Withdrawal",
            withdrawalId: "cost_1",
            to: freshAddress(),
            amount: 2n
          })
          const methods = counted.methods()
          // The gas estimate and the broadcast: no ask for the nonce (D331); the fee estimate is asked at
          // most once per 1.5 s (D330, counted exactly in test/chain/outgoingFees.test.ts), so it may show here.
          const fees = new Set(["eth_getBlockByNumber", "eth_maxPriorityFeePerGas"])
          assert.deepStrictEqual(
            methods.filter((m) => !fees.has(m)),
            ["eth_estimateGas", "eth_sendRawTransaction"],
            methods.join(", ")
          )
          const { statements, transactions } = statementsOf("Treasury.send")
          // Adopt check; the lock, the raced check, the record with the nonce; the broadcast noted.
          assert.strictEqual(statements.length, 5, statements.join("\n---\n"))
          assert.strictEqual(transactions, 1)
          assert.isFalse(
            statements.some((text) => /^\s*UPDATE\s+treasury_senders/i.test(text)),
            "the next nonce is written by the record's statement"
          )
          assert.strictEqual((yield* treasury.confirm(hash)).status, "success")
        })
    )
  })
})

describe("a confirm on a chain whose blocks are seconds apart (D452)", () => {
  const SlowChain = Chain.layer.pipe(
    Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({ CHAIN_BLOCK_TIME: "1" })))
  )
  layer(Layer.mergeAll(Database, SlowChain), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("looks at its transaction once a block, not once a poll interval", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        yield* fundTreasury(1_000_000n)
        const treasury = yield* Treasury.make()
        // Sent just after a block: the next one is about a second (ten 100 ms polls) away.
        const start = yield* chain.blockNumber()
        while ((yield* chain.blockNumber()) === start) yield* Effect.sleep("20 millis")
        const hash = yield* treasury.send({
          _tag: "Withdrawal",
          withdrawalId: "slow_1",
          to: freshAddress(),
          amount: 1n
        })
        const realFetch = globalThis.fetch
        const methods: Array<string> = []
        globalThis.fetch = (input, init) => {
          if (typeof init?.body === "string") {
            const body = JSON.parse(init.body) as { method: string } | Array<{ method: string }>
            for (const call of Array.isArray(body) ? body : [body]) methods.push(call.method)
          }
          return realFetch(input, init)
        }
        const outcome = yield* treasury
          .confirm(hash)
          .pipe(Effect.ensuring(Effect.sync(() => (globalThis.fetch = realFetch))))
        assert.strictEqual(outcome.status, "success")
        // Each look that finds it pending asks for the transaction itself: one before the block (two if
        // the head read raced it), where a look every 100 ms made about ten.
        const pendingLooks = methods.filter((m) => m === "eth_getTransactionByHash").length
        assert.isAtMost(pendingLooks, 2, methods.join(", "))
      })
    )
  })
})
