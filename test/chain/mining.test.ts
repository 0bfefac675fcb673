import { assert, describe, it, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { Chain, miningConfig } from "../../src/chain/Chain.ts"
import { QUICK_READ_TIMEOUT_MS } from "../../src/chain/Connection.ts"
import { makeMiningPacer } from "../../src/chain/Mining.ts"
import { httpPost } from "../../src/chain/QuickReads.ts"

const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

const rpc = (url: string, method: string, params: ReadonlyArray<unknown> = []) =>
  Effect.promise(async () => {
    const response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params })
    })
    const answer = (await response.json()) as { result?: unknown; error?: { message: string } }
    if (answer.error !== undefined) throw new Error(answer.error.message)
    return answer.result
  })

layer(ChainEmbedded, { excludeTestServices: true, timeout: "60 seconds" })(
  "the embedded chain's mining pace (D450)",
  (it) => {
    it.effect(
      "goes to a block a second when transactions come fast, and back to a block per transaction when they stop",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const url = chain.rpcUrl
          const pacer = makeMiningPacer(httpPost(url, QUICK_READ_TIMEOUT_MS), {
            busyPerSecond: 3,
            quietPerSecond: 1,
            quietLooks: 2,
            lookEveryMs: 1000
          })
          const from = chain.demoWallets[7]!.address
          const sendSome = (count: number) =>
            Effect.forEach(
              Array.from({ length: count }, (_, i) => i),
              () => Effect.map(rpc(url, "eth_sendTransaction", [{ from, to: from, value: "0x1" }]), String)
            )
          const mined = (hash: string) =>
            Effect.promise(() =>
              chain.publicClient.waitForTransactionReceipt({
                hash: hash as `0x${string}`,
                pollingInterval: 20,
                timeout: 10_000
              })
            )

          yield* pacer.look
          // A few transactions now and then: still a block per transaction.
          yield* sendSome(1)
          yield* Effect.sleep("1100 millis")
          yield* pacer.look
          assert.isFalse(pacer.intervalMining())
          assert.isTrue((yield* rpc(url, "anvil_getAutomine")) as boolean)

          // Many at once: the next look sets a block a second. Each is mined by automine in a task after Anvil
          // took it: the last is waited for, else a loaded machine's look could miss it, and it would be mined
          // in the first interval block with the two below, making the first quiet look a busy one.
          const many = yield* sendSome(8)
          yield* mined(many.at(-1)!)
          yield* pacer.look
          assert.isTrue(pacer.intervalMining())
          assert.isFalse((yield* rpc(url, "anvil_getAutomine")) as boolean)
          // Sent now, it waits for the next block: two transactions in one block.
          const before = BigInt((yield* rpc(url, "eth_blockNumber")) as string)
          const a = (yield* rpc(url, "eth_sendTransaction", [{ from, to: from, value: "0x1" }])) as string
          const b = (yield* rpc(url, "eth_sendTransaction", [{ from, to: from, value: "0x1" }])) as string
          const receipts = yield* Effect.forEach([a, b], (hash) =>
            Effect.promise(() =>
              chain.publicClient.waitForTransactionReceipt({
                hash: hash as `0x${string}`,
                pollingInterval: 50
              })
            )
          )
          assert.strictEqual(receipts[0]!.blockNumber, receipts[1]!.blockNumber)
          assert.isTrue(receipts[0]!.blockNumber > before)

          // Quiet looks in a row: back to a block per transaction, which mines a transaction at once.
          yield* Effect.sleep("1100 millis")
          yield* pacer.look
          yield* Effect.sleep("1100 millis")
          yield* pacer.look
          assert.isFalse(pacer.intervalMining())
          assert.isTrue((yield* rpc(url, "anvil_getAutomine")) as boolean)
          const quiet = (yield* rpc(url, "eth_sendTransaction", [{ from, to: from, value: "0x1" }])) as string
          // Anvil mines it in a task of its own right after taking it, not inside the call: on a loaded
          // machine the receipt can be a moment later (the full suite once read null at once).
          assert.strictEqual((yield* mined(quiet)).status, "success")
        })
    )

    it.effect(
      "a switch the pacer did not see answered (its reply lost) is read from the chain: a quiet chain still goes back",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const url = chain.rpcUrl
          const pacer = makeMiningPacer(httpPost(url, QUICK_READ_TIMEOUT_MS), {
            busyPerSecond: 3,
            quietPerSecond: 1,
            quietLooks: 2,
            lookEveryMs: 1000
          })
          yield* pacer.look
          assert.isFalse(pacer.intervalMining())
          // The chain mines a block a second, but the pacer never got the answer to its switch.
          yield* rpc(url, "evm_setIntervalMining", [1])
          yield* pacer.look
          assert.isTrue(pacer.intervalMining(), "read from the chain")
          yield* Effect.sleep("1100 millis")
          yield* pacer.look
          yield* Effect.sleep("1100 millis")
          yield* pacer.look
          assert.isFalse(pacer.intervalMining())
          assert.isTrue((yield* rpc(url, "anvil_getAutomine")) as boolean)
        })
    )
  }
)

describe("CHAIN_BLOCK_TIME", () => {
  const read = (env: Record<string, string>) =>
    miningConfig({ _tag: "paced" })
      .parse(ConfigProvider.fromEnvRecord(env))
      .pipe(Effect.match({ onFailure: () => "refused" as const, onSuccess: (mining) => mining }))

  it.effect("unset: the layer's own; 0: a block per transaction; seconds: a block every that many", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* read({}), { _tag: "paced" })
      assert.deepStrictEqual(yield* read({ CHAIN_BLOCK_TIME: "0" }), { _tag: "automine" })
      assert.deepStrictEqual(yield* read({ CHAIN_BLOCK_TIME: "0.5" }), { _tag: "interval", seconds: 0.5 })
      assert.strictEqual(yield* read({ CHAIN_BLOCK_TIME: "-1" }), "refused")
    })
  )
})
