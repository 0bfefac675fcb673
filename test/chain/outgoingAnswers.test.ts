import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { MaxOpsBeforeYield } from "effect/Scheduler"
import type { Hash } from "viem"
import { makeJsonRpcBatch, type PostJson } from "../../src/chain/JsonRpc.ts"
import { makeOutgoing, type OutgoingCall } from "../../src/chain/Outgoing.ts"
import { embeddedKeys } from "../support/CountingRpc.ts"

interface Call {
  readonly id: number
  readonly method: string
  readonly params: ReadonlyArray<unknown>
}

/** A node without HTTP: `answer` writes each call's JSON-RPC answer (its id is added). */
const fakeNode =
  (answer: (call: Call) => Record<string, unknown>): PostJson =>
  (body) =>
    Promise.resolve({
      status: 200,
      body: JSON.stringify(
        (JSON.parse(body) as ReadonlyArray<Call>).map((call) => ({
          jsonrpc: "2.0",
          id: call.id,
          ...answer(call)
        }))
      )
    })

const hash = `0x${"ab".repeat(32)}` as Hash
const call: OutgoingCall = {
  from: "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
  to: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
  data: "0x"
}

describe("Outgoing against answers Anvil never gives (D487)", () => {
  it.effect(
    "only a null result is 'not found': an answer without a result is unreadable, never Unknown",
    () =>
      Effect.gen(function* () {
        const outgoing = (receipt: Record<string, unknown>, transaction: Record<string, unknown>) =>
          makeOutgoing(
            makeJsonRpcBatch(
              fakeNode((c) => (c.method === "eth_getTransactionReceipt" ? receipt : transaction))
            ),
            31337,
            embeddedKeys
          )
        // Neither: the node knows nothing of it.
        assert.deepStrictEqual(yield* outgoing({ result: null }, { result: null }).state(hash), {
          _tag: "Unknown"
        })
        assert.deepStrictEqual(yield* outgoing({ result: null }, { result: { hash } }).state(hash), {
          _tag: "Pending"
        })
        // A receipt answer with neither result nor error: not a "no receipt".
        const noReceipt = yield* Effect.flip(outgoing({}, { result: null }).state(hash))
        assert.strictEqual(noReceipt.reason, "Rpc")
        assert.strictEqual(
          noReceipt.message,
          "Outgoing.state failed: the node's answer is not what was asked"
        )
        // No receipt, and a transaction answer without a result: not "never pooled".
        const noTransaction = yield* Effect.flip(outgoing({ result: null }, {}).state(hash))
        assert.strictEqual(noTransaction.reason, "Rpc")
        assert.strictEqual(
          noTransaction.message,
          "Outgoing.state failed: the node's answer is not what was asked"
        )
      })
  )

  it.live("an asker interrupted at any point leaves no fee ask for later plans to wait on forever", () =>
    Effect.gen(function* () {
      const post = fakeNode((c) => {
        switch (c.method) {
          case "eth_getBlockByNumber":
            return { result: { baseFeePerGas: "0x64" } }
          case "eth_maxPriorityFeePerGas":
            return { result: "0x2" }
          default:
            return { result: "0x5208" }
        }
      })
      // The asker yields every few operations (MaxOpsBeforeYield; 1 and 2 livelock Effect's run loop) and
      // is interrupted after a growing number of event-loop turns: the interrupt lands between any two of
      // its operations, one of them between sharing the ask and starting it (before D487's amendment, one
      // of these rounds left a later plan waiting forever).
      const turn = Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
      for (let ops = 3; ops <= 7; ops++) {
        for (let turns = 0; turns < 25; turns++) {
          const outgoing = makeOutgoing(makeJsonRpcBatch(post), 31337, embeddedKeys, { feeTtlMs: 0 })
          const asker = yield* Effect.forkChild(
            outgoing.plan(call).pipe(Effect.provideService(MaxOpsBeforeYield, ops)),
            { startImmediately: true }
          )
          for (let i = 0; i < turns; i++) yield* turn
          yield* Fiber.interrupt(asker)
          const later = yield* Effect.timeoutOption(outgoing.plan(call), "1 second")
          assert.strictEqual(
            later._tag,
            "Some",
            `yielding every ${ops} operations, interrupted after ${turns} turns`
          )
        }
      }
    })
  )
})
