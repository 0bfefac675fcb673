import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { BaseError, type PublicClient } from "viem"
import { Chain, type OutgoingCall } from "../../src/chain/Chain.ts"
import { FEE_ESTIMATE_TTL_MS, makeOutgoing } from "../../src/chain/Outgoing.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

/**
 * The chain's real client with its fee estimates counted, and a broadcast that can be made to fail the way a
 * node refuses an underpriced transaction.
 */
const countingClient = (client: PublicClient) => {
  const counts = { fees: 0 }
  let refuseAsUnderpriced = false
  const wrapped = new Proxy(client, {
    get(target, key, receiver) {
      if (key === "estimateFeesPerGas")
        return (...args: Parameters<PublicClient["estimateFeesPerGas"]>) => {
          counts.fees++
          return target.estimateFeesPerGas(...args)
        }
      if (key === "sendRawTransaction" && refuseAsUnderpriced)
        return () => Promise.reject(new BaseError("replacement transaction underpriced"))
      return Reflect.get(target, key, receiver)
    }
  })
  return { wrapped, counts, refuse: (on: boolean) => (refuseAsUnderpriced = on) }
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
          const { wrapped, counts, refuse } = countingClient(chain.publicClient as PublicClient)
          const outgoing = makeOutgoing(wrapped as typeof chain.publicClient, chain.chainId, [])
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

          // A node refusing a transaction as underpriced empties the cache: the error still reaches the caller.
          refuse(true)
          const refused = yield* Effect.flip(outgoing.broadcast("0x02"))
          assert.strictEqual(refused._tag, "ChainError")
          refuse(false)
          yield* outgoing.plan(call)
          assert.strictEqual(counts.fees, 3)

          // Any other broadcast failure leaves the estimate in place.
          yield* Effect.flip(outgoing.broadcast("0x02"))
          yield* outgoing.plan(call)
          assert.strictEqual(counts.fees, 3)
        })
    )

    it.effect("a TTL of 0 asks the node for every plan", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { wrapped, counts } = countingClient(chain.publicClient as PublicClient)
        const outgoing = makeOutgoing(wrapped as typeof chain.publicClient, chain.chainId, [], {
          feeTtlMs: 0
        })
        const call = selfTransfer(chain)
        yield* outgoing.plan(call)
        yield* outgoing.plan(call)
        assert.strictEqual(counts.fees, 2)
      })
    )
  })
})
