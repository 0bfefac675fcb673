import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Chain, type OutgoingCall } from "../../src/chain/Chain.ts"
import { FEE_ESTIMATE_TTL_MS, makeOutgoing } from "../../src/chain/Outgoing.ts"
import { countingRpc } from "../support/CountingRpc.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

/** The node over HTTP with its fee estimates counted (each asks for the latest block). */
const countingFees = (rpcUrl: string) => {
  const counting = countingRpc(rpcUrl)
  const counts = {
    get fees() {
      return counting.methods().filter((method) => method === "eth_getBlockByNumber").length
    }
  }
  const underpriced = { code: -32000, message: "replacement transaction underpriced" }
  return {
    rpc: counting.rpc,
    counts,
    refuse: (on: boolean) => counting.refuse("eth_sendRawTransaction", on ? underpriced : undefined)
  }
}

/** A call that estimates: a zero-value token transfer from the payer to itself. */
const selfTransfer = (chain: Chain["Service"]): OutgoingCall => chain.calls.treasuryTransfer(chain.payer, 0n)

describe("Outgoing: one fee estimate serves the chain's plans for a bounded time (D330)", () => {
  layer(ChainEmbedded, { timeout: "60 seconds" })((it) => {
    it.effect(
      "plans within the TTL share an estimate; past it, or after an underpriced refusal, the node is asked again",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const { rpc, counts, refuse } = countingFees(chain.rpcUrl)
          const outgoing = makeOutgoing(rpc, chain.chainId, [])
          const call = selfTransfer(chain)

          const first = yield* outgoing.plan(call)
          yield* outgoing.plan(call)
          yield* TestClock.adjust(FEE_ESTIMATE_TTL_MS - 1)
          const cached = yield* outgoing.plan(call)
          assert.strictEqual(counts.fees, 1)
          assert.strictEqual(cached.maxFeePerGas, first.maxFeePerGas)

          // Expired: the next plan asks the node, and that estimate is cached in turn.
          yield* TestClock.adjust(1)
          yield* outgoing.plan(call)
          yield* outgoing.plan(call)
          assert.strictEqual(counts.fees, 2)

          // Plans made together while the estimate is stale share one ask.
          yield* TestClock.adjust(FEE_ESTIMATE_TTL_MS)
          yield* Effect.all([outgoing.plan(call), outgoing.plan(call), outgoing.plan(call)], {
            concurrency: "unbounded"
          })
          assert.strictEqual(counts.fees, 3)

          // A node refusing a transaction as underpriced empties the cache: the error still reaches the caller.
          refuse(true)
          const refused = yield* Effect.flip(outgoing.broadcast("0x02"))
          assert.strictEqual(refused._tag, "ChainError")
          assert.strictEqual(refused.reason, "Rpc")
          refuse(false)
          yield* outgoing.plan(call)
          assert.strictEqual(counts.fees, 4)

          // Any other broadcast failure leaves the estimate in place.
          yield* Effect.flip(outgoing.broadcast("0x02"))
          yield* outgoing.plan(call)
          assert.strictEqual(counts.fees, 4)
        })
    )

    it.effect("a TTL of 0 asks the node for every plan", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { rpc, counts } = countingFees(chain.rpcUrl)
        const outgoing = makeOutgoing(rpc, chain.chainId, [], { feeTtlMs: 0 })
        const call = selfTransfer(chain)
        yield* outgoing.plan(call)
        yield* outgoing.plan(call)
        assert.strictEqual(counts.fees, 2)
      })
    )
  })
})
