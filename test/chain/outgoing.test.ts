import { assert, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { type Hash, keccak256 } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import {
  Chain,
  type ChainShape,
  randomAuthorizationNonce,
  signTransferAuthorization
} from "../../src/chain/Chain.ts"
import { BACKGROUND_RPC } from "../../src/chain/Connection.ts"
import { routerSignerAccount } from "../../src/chain/DevAccounts.ts"
import { httpPost, makeJsonRpcBatch } from "../../src/chain/JsonRpc.ts"
import { makeOutgoing } from "../../src/chain/Outgoing.ts"
import { nodeCall } from "../support/ChainSend.ts"
import { countedChain, embeddedKeys } from "../support/CountingRpc.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

/** The node's count of the sender's transactions, pooled ones included. */
const pendingNonce = (chain: ChainShape) =>
  Effect.promise(() => chain.publicClient.getTransactionCount({ address: chain.payer, blockTag: "pending" }))

/** A demo wallet's authorization to pay the treasury, as the router settles it. */
const authorization = (chain: ChainShape, wallet = 3) =>
  Effect.gen(function* () {
    const account = privateKeyToAccount(chain.demoWallets[wallet]!.privateKey!)
    const params = {
      token: chain.token,
      chainId: chain.chainId,
      domain: chain.tokenDomain,
      to: chain.treasury,
      value: 1_000n,
      validAfter: 0n,
      validBefore: BigInt(Math.floor(Date.now() / 1000) + 3600),
      nonce: randomAuthorizationNonce()
    }
    const signature = yield* Effect.promise(() => signTransferAuthorization(account, params))
    return { ...params, from: account.address, signature }
  })

layer(ChainEmbedded, { timeout: "60 seconds" })(
  "Outgoing over batched JSON-RPC (embedded Anvil, D485)",
  (it) => {
    it.effect(
      "a transaction signed in WebAssembly is viem's, accepted and mined; calls of a turn share a request",
      () =>
        Effect.gen(function* () {
          const { chain, requests } = countedChain(yield* Chain)
          const payment = yield* authorization(chain)
          const call = chain.calls.transferWithAuthorization(payment)
          const plan = yield* chain.outgoing.plan(call)
          const nonce = yield* chain.outgoing.minedNonce(call.from)
          const signed = yield* chain.outgoing.sign(call, plan, nonce)
          const viaViem = yield* Effect.promise(() =>
            routerSignerAccount().signTransaction({
              type: "eip1559",
              chainId: chain.chainId,
              to: call.to,
              data: call.data,
              value: 0n,
              nonce,
              ...plan
            })
          )
          assert.strictEqual(signed.raw, viaViem)
          assert.strictEqual(signed.hash, keccak256(viaViem))
          assert.strictEqual(yield* chain.outgoing.broadcast(signed.raw), "accepted")
          // Anvil mines in a task of its own right after taking a transaction, not inside the call: wait
          // for the receipt before reading the state (CI once read Pending at once).
          const receipt = yield* chain.waitForReceipt(signed.hash)
          const mined = yield* chain.outgoing.state(signed.hash)
          assert.deepStrictEqual(mined, {
            _tag: "Mined",
            status: "success",
            blockNumber: receipt.blockNumber
          })
          assert.isTrue(yield* chain.authorizationState(payment.from, payment.nonce))
          assert.strictEqual(yield* chain.outgoing.minedNonce(call.from), nonce + 1)
          // The head as viem reads it, from the batch (D578): at or past the block that mined it.
          const [head, viaViemHead] = yield* Effect.all([
            chain.outgoing.head,
            Effect.promise(() => chain.publicClient.getBlockNumber({ cacheTime: 0 }))
          ])
          assert.strictEqual(head, viaViemHead)
          assert.isAtLeast(Number(head), Number(receipt.blockNumber))

          // Plans, states and counts asked for together: one HTTP request.
          requests.length = 0
          const transfers = Array.from({ length: 5 }, () => chain.calls.treasuryTransfer(chain.treasury, 0n))
          yield* Effect.all(
            [
              Effect.forEach(transfers, chain.outgoing.plan, { concurrency: "unbounded" }),
              chain.outgoing.state(signed.hash),
              chain.outgoing.minedNonce(call.from),
              chain.outgoing.head
            ],
            { concurrency: "unbounded" }
          )
          assert.strictEqual(requests.length, 1, JSON.stringify(requests))
          assert.strictEqual(requests[0]!.filter((method) => method === "eth_estimateGas").length, 5)
          assert.include(requests[0]!, "eth_blockNumber")
        })
    )

    it.effect(
      "settlements of one class share an estimate for its TTL, each checked by eth_call; a used one still fails Reverted (D530)",
      () =>
        Effect.gen(function* () {
          const { chain, methods, paramsOf } = countedChain(yield* Chain)
          const calls = yield* Effect.forEach([1, 2, 3], () =>
            Effect.map(authorization(chain), chain.calls.transferWithAuthorization)
          )
          assert.isDefined(calls[0]!.gasClass)
          const first = yield* chain.outgoing.plan(calls[0]!)
          assert.deepStrictEqual(
            methods().filter((m) => m === "eth_estimateGas" || m === "eth_call"),
            ["eth_estimateGas"]
          )
          // The class's next plans: one eth_call each, no estimate; the gas is the estimate's with half again.
          const [second, third] = yield* Effect.forEach(calls.slice(1), chain.outgoing.plan)
          assert.deepStrictEqual(
            methods().filter((m) => m === "eth_estimateGas" || m === "eth_call"),
            ["eth_estimateGas", "eth_call", "eth_call"]
          )
          // Each check runs at the latest block, never `pending`: a node answers `pending` by running the
          // whole pool first (D532).
          assert.deepStrictEqual(
            paramsOf("eth_call").map((params) => params[1]),
            ["latest", "latest"]
          )
          assert.closeTo(Number(second!.gas) / Number(first.gas), 150 / 125, 0.0001)
          assert.strictEqual(third!.gas, second!.gas)
          // Planned from the class, the transfer is mined and succeeds, using less than planned.
          const signed = yield* chain.outgoing.sign(
            calls[1]!,
            second!,
            yield* chain.outgoing.minedNonce(calls[1]!.from)
          )
          yield* chain.outgoing.broadcast(signed.raw)
          const mined = yield* Effect.promise(() =>
            chain.publicClient.waitForTransactionReceipt({
              hash: signed.hash,
              pollingInterval: 20,
              timeout: 10_000
            })
          )
          assert.strictEqual(mined.status, "success")
          assert.isBelow(Number(mined.gasUsed), Number(second!.gas))
          // The same authorization again: the eth_call under the class's limit fails, so the call is
          // estimated, which reverts with the token's reason: nothing is planned.
          const used = yield* Effect.flip(chain.outgoing.plan(calls[1]!))
          assert.strictEqual(used.reason, "Reverted")
          assert.strictEqual(
            used.message,
            "Outgoing.plan reverted: FiatTokenV2: authorization is used or canceled"
          )
          assert.strictEqual(methods().filter((m) => m === "eth_estimateGas").length, 2)
          // A plain transfer has no class: estimated every time.
          const transfer = chain.calls.treasuryTransfer(chain.treasury, 0n)
          assert.isUndefined(transfer.gasClass)
          yield* chain.outgoing.plan(transfer)
          yield* chain.outgoing.plan(transfer)
          assert.strictEqual(methods().filter((m) => m === "eth_estimateGas").length, 4)
        })
    )

    it.effect(
      "a settlement that needs more than its class's limit is estimated, and does not raise the class's limit (D530)",
      () =>
        Effect.gen(function* () {
          const { chain, methods } = countedChain(yield* Chain)
          const classified = () => methods().filter((m) => m === "eth_estimateGas" || m === "eth_call")
          const normal = () => Effect.map(authorization(chain, 3), chain.calls.transferWithAuthorization)
          const warm = yield* chain.outgoing.plan(yield* normal())
          const classLimit = yield* chain.outgoing.plan(yield* normal())
          assert.deepStrictEqual(classified(), ["eth_estimateGas", "eth_call"])
          // A payer with code (an EIP-7702-delegated EOA): the token asks its ERC-1271 isValidSignature,
          // which here burns about 210k gas before saying yes. Its v, r, s signature puts it in the class.
          const wallet = chain.demoWallets[5]!.address
          const burner = `0x612000${"5b600190038060035750"}7f1626ba7e${"00".repeat(28)}60005260206000f3`
          const costly = yield* Effect.gen(function* () {
            yield* nodeCall(chain, "anvil_setCode", [wallet, burner])
            const call = chain.calls.transferWithAuthorization(yield* authorization(chain, 5))
            assert.strictEqual(call.gasClass, (yield* normal()).gasClass)
            return yield* chain.outgoing.plan(call)
          }).pipe(Effect.ensuring(nodeCall(chain, "anvil_setCode", [wallet, "0x"])))
          // The call failed under the class's limit: it was estimated, and planned with its own estimate.
          assert.deepStrictEqual(classified(), ["eth_estimateGas", "eth_call", "eth_call", "eth_estimateGas"])
          assert.isAbove(Number(costly.gas), Number(classLimit.gas) + 150_000)
          // The class keeps its lower estimate: the next settlement is planned as before.
          const after = yield* chain.outgoing.plan(yield* normal())
          assert.strictEqual(after.gas, classLimit.gas)
          assert.isAbove(Number(classLimit.gas), Number(warm.gas))
        })
    )

    it.effect("with a gas TTL of 0 every settlement is estimated", () =>
      Effect.gen(function* () {
        const { chain, methods } = countedChain(yield* Chain, { gasTtlMs: 0 })
        yield* Effect.forEach([1, 2], () =>
          Effect.flatMap(
            Effect.map(authorization(chain), chain.calls.transferWithAuthorization),
            chain.outgoing.plan
          )
        )
        assert.deepStrictEqual(
          methods().filter((m) => m === "eth_estimateGas" || m === "eth_call"),
          ["eth_estimateGas", "eth_estimateGas"]
        )
      })
    )

    it.effect("an estimate that would revert fails Reverted with the token's reason, naming no URL", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const payment = yield* authorization(chain)
        const call = chain.calls.transferWithAuthorization(payment)
        const first = yield* chain.outgoing.sign(
          call,
          yield* chain.outgoing.plan(call),
          yield* chain.outgoing.minedNonce(call.from)
        )
        yield* chain.outgoing.broadcast(first.raw)
        yield* chain.waitForReceipt(first.hash)
        assert.strictEqual((yield* chain.outgoing.state(first.hash))._tag, "Mined")
        // The authorization is used now: estimating it again reverts.
        const used = yield* Effect.flip(chain.outgoing.plan(call))
        assert.strictEqual(used.reason, "Reverted")
        assert.strictEqual(
          used.message,
          "Outgoing.plan reverted: FiatTokenV2: authorization is used or canceled"
        )
        assert.notInclude(used.message, chain.rpcUrl.replace(/^https?:\/\//, ""))
      })
    )

    it.effect(
      "known bytes, a pending transaction, an underpriced replacement, a used nonce, an unknown hash",
      () =>
        Effect.gen(function* () {
          const { chain, methods } = countedChain(yield* Chain)
          const transfer = chain.calls.treasuryTransfer(chain.demoWallets[0]!.address, 1n)
          const plan = yield* chain.outgoing.plan(transfer)
          yield* nodeCall(chain, "evm_setAutomine", [false])
          const pooled = yield* Effect.gen(function* () {
            const nonce = yield* pendingNonce(chain)
            const signed = yield* chain.outgoing.sign(transfer, plan, nonce)
            assert.strictEqual(yield* chain.outgoing.broadcast(signed.raw), "accepted")
            // A pooled transaction's look is two reads: no receipt, then the node's copy without a block.
            const looked = methods().length
            assert.deepStrictEqual(yield* chain.outgoing.state(signed.hash), { _tag: "Pending" })
            assert.deepStrictEqual(methods().slice(looked), [
              "eth_getTransactionReceipt",
              "eth_getTransactionByHash"
            ])
            // The same bytes again: the node already has them.
            assert.strictEqual(yield* chain.outgoing.broadcast(signed.raw), "accepted")
            // Other bytes for the same nonce, no better paid: refused, and the fee estimate is asked again.
            const other = yield* chain.outgoing.sign(
              chain.calls.treasuryTransfer(chain.treasury, 0n),
              plan,
              nonce
            )
            const before = methods().filter((method) => method === "eth_getBlockByNumber").length
            const underpriced = yield* Effect.flip(chain.outgoing.broadcast(other.raw))
            assert.strictEqual(underpriced.reason, "Rpc")
            assert.match(underpriced.message, /^Outgoing\.broadcast failed: .*underpriced/i)
            yield* chain.outgoing.plan(transfer)
            assert.strictEqual(
              methods().filter((method) => method === "eth_getBlockByNumber").length,
              before + 1
            )
            return { signed, nonce }
          }).pipe(Effect.ensuring(nodeCall(chain, "evm_setAutomine", [true])))
          yield* nodeCall(chain, "evm_mine")
          const mined = yield* chain.outgoing.state(pooled.signed.hash)
          assert.strictEqual(mined._tag, "Mined")
          assert.strictEqual(yield* chain.outgoing.minedNonce(transfer.from), pooled.nonce + 1)
          // Mined: its nonce is used, by these very bytes.
          assert.strictEqual(yield* chain.outgoing.broadcast(pooled.signed.raw), "nonceUsed")
          // Never sent: the node knows nothing of it.
          const unsent = yield* chain.outgoing.sign(transfer, plan, pooled.nonce + 1)
          assert.deepStrictEqual(yield* chain.outgoing.state(unsent.hash), { _tag: "Unknown" })
          assert.deepStrictEqual(yield* chain.outgoing.state(`0x${"00".repeat(32)}` as Hash), {
            _tag: "Unknown"
          })
        })
    )

    it.effect(
      "a receipt of a reverted transaction; no key, no signature; an unreachable node fails Rpc",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          // Gas below what the call needs: mined, and reverted.
          const transfer = chain.calls.treasuryTransfer(chain.demoWallets[1]!.address, 1n)
          const plan = yield* chain.outgoing.plan(transfer)
          const starved = yield* chain.outgoing.sign(
            transfer,
            { ...plan, gas: 25_000n },
            yield* chain.outgoing.minedNonce(transfer.from)
          )
          assert.strictEqual(yield* chain.outgoing.broadcast(starved.raw), "accepted")
          yield* Effect.promise(() =>
            chain.publicClient.waitForTransactionReceipt({
              hash: starved.hash,
              pollingInterval: 20,
              timeout: 10_000
            })
          )
          const state = yield* chain.outgoing.state(starved.hash)
          assert.strictEqual(state._tag === "Mined" ? state.status : state._tag, "reverted")

          const stranger = { ...transfer, from: privateKeyToAccount(`0x${"42".repeat(32)}`).address }
          const refused = yield* Effect.flip(chain.outgoing.sign(stranger, plan, 0))
          assert.strictEqual(refused.reason, "Config")

          // A node that cannot be reached: each call is sent again (a broadcast is not), then fails Rpc.
          const attempts: Array<string> = []
          const down = httpPost("http://127.0.0.1:9/secret-api-key", 1_000)
          const rpc = makeJsonRpcBatch(
            (body) => {
              attempts.push(...(JSON.parse(body) as ReadonlyArray<{ method: string }>).map((c) => c.method))
              return down(body)
            },
            { retries: 2, retryDelayMs: () => 5 }
          )
          const unreachable = makeOutgoing(rpc, chain.chainId, embeddedKeys)
          const [count, sent] = yield* Effect.all(
            [
              Effect.flip(unreachable.minedNonce(transfer.from)),
              Effect.flip(unreachable.broadcast(starved.raw))
            ],
            { concurrency: "unbounded" }
          )
          assert.deepStrictEqual([count.reason, sent.reason], ["Rpc", "Rpc"])
          assert.notInclude(count.message, "secret-api-key")
          assert.notInclude(count.message, "127.0.0.1")
          assert.deepStrictEqual(attempts.sort(), [
            "eth_getTransactionCount",
            "eth_getTransactionCount",
            "eth_getTransactionCount",
            "eth_sendRawTransaction"
          ])

          // A transient error answer (viem's set: -32603 internal error, rate limits) is asked again, up to
          // BACKGROUND_RPC's retries, and then fails with the node's message; any other error answer is final,
          // and a broadcast is sent once whatever the node answers.
          const counted = countedChain(chain)
          counted.refuse("eth_getTransactionCount", { code: -32603, message: "internal error" })
          const answered = yield* Effect.flip(counted.chain.outgoing.minedNonce(transfer.from))
          assert.strictEqual(answered.message, "Outgoing.minedNonce failed: internal error")
          assert.strictEqual(counted.requests.length, 1 + BACKGROUND_RPC.retryCount)
          counted.requests.length = 0
          counted.refuse("eth_getTransactionCount", { code: -32000, message: "header not found" })
          const final = yield* Effect.flip(counted.chain.outgoing.minedNonce(transfer.from))
          assert.strictEqual(final.message, "Outgoing.minedNonce failed: header not found")
          assert.strictEqual(counted.requests.length, 1)
          counted.requests.length = 0
          counted.refuse("eth_sendRawTransaction", { code: -32603, message: "internal error" })
          const broadcastRefused = yield* Effect.flip(counted.chain.outgoing.broadcast(starved.raw))
          assert.strictEqual(broadcastRefused.message, "Outgoing.broadcast failed: internal error")
          assert.strictEqual(counted.requests.length, 1)

          // Transient the first time, answered the second: the call succeeds.
          counted.requests.length = 0
          counted.refuse("eth_getTransactionCount", { code: 429, message: "rate limited" })
          // (A real timer: the retry waits 150 ms of real time, the test's clock is a TestClock.)
          setTimeout(() => counted.refuse("eth_getTransactionCount", undefined), 20)
          assert.strictEqual(
            yield* counted.chain.outgoing.minedNonce(transfer.from),
            yield* chain.outgoing.minedNonce(transfer.from)
          )
          assert.strictEqual(counted.requests.length, 2)
        })
    )
  }
)
