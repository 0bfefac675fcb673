import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { assert, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Fiber, Layer } from "effect"
import { type Address, getAddress } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { testUsdcAbi } from "../../src/chain/artifacts.ts"
import { Chain, randomAuthorizationNonce, signTransferAuthorization } from "../../src/chain/Chain.ts"
import { QUICK_READ_TIMEOUT_MS, quickCall } from "../../src/chain/Connection.ts"
import { PERMIT2_ADDRESS } from "../../src/chain/Permit2.ts"
import { permit2Abi } from "../../src/chain/permit2Artifact.ts"
import {
  httpPost,
  makeQuickReads,
  type PostJson,
  QUICK_BATCH_LIMIT,
  readCalldata
} from "../../src/chain/QuickReads.ts"
import { submit } from "../support/ChainSend.ts"

const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

/** The router's POST to the node, counting the HTTP requests and the reads each carried. */
const countingPost = (rpcUrl: string) => {
  const batches: Array<number> = []
  const post = httpPost(rpcUrl, QUICK_READ_TIMEOUT_MS)
  const counted: PostJson = (body) => {
    batches.push(JSON.parse(body).length)
    return post(body)
  }
  return { batches, counted }
}

layer(ChainEmbedded, { timeout: "60 seconds" })("QuickReads (embedded Anvil)", (it) => {
  it.effect("reads asked for in one turn go out as one batch, each answered as viem reads it", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { batches, counted } = countingPost(chain.rpcUrl)
      const reads = makeQuickReads(counted)
      // One authorization used on chain, one not: the batch must tell them apart.
      const wallet = chain.demoWallets[0]!
      const account = privateKeyToAccount(wallet.privateKey!)
      const params = {
        token: chain.token,
        chainId: chain.chainId,
        domain: chain.tokenDomain,
        to: chain.treasury,
        value: 10_000n,
        validAfter: 0n,
        validBefore: BigInt(Math.floor(Date.now() / 1000) + 3600),
        nonce: randomAuthorizationNonce()
      }
      const signature = yield* Effect.promise(() => signTransferAuthorization(account, params))
      yield* chain.waitForReceipt(yield* submit(chain, { ...params, from: account.address, signature }))
      const unused = randomAuthorizationNonce()
      const stranger = getAddress("0x000000000000000000000000000000000000dEaD")
      const owners: ReadonlyArray<Address> = [
        ...chain.demoWallets.map((w) => w.address),
        chain.treasury,
        stranger
      ]

      const [balances, used, notUsed, allowance, word] = yield* Effect.all(
        [
          Effect.forEach(
            owners,
            (owner) => reads.uint("balance", chain.token, () => readCalldata.balanceOf(owner)),
            {
              concurrency: "unbounded"
            }
          ),
          reads.bool("state", chain.token, () =>
            readCalldata.authorizationState(account.address, params.nonce)
          ),
          reads.bool("state", chain.token, () => readCalldata.authorizationState(account.address, unused)),
          reads.uint("allowance", chain.token, () =>
            readCalldata.allowance(account.address, PERMIT2_ADDRESS)
          ),
          reads.uint("bitmap", PERMIT2_ADDRESS, () => readCalldata.nonceBitmap(account.address, 0n))
        ],
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(batches, [owners.length + 4], "every read of the turn in one HTTP request")

      const viemRead = <A>(read: () => Promise<A>) => Effect.promise(read)
      for (const [i, owner] of owners.entries()) {
        const expected = yield* viemRead(() =>
          chain.publicClient.readContract({
            address: chain.token,
            abi: testUsdcAbi,
            functionName: "balanceOf",
            args: [owner]
          })
        )
        assert.strictEqual(balances[i], expected, owner)
      }
      assert.strictEqual(balances[owners.length - 1], 0n)
      assert.isTrue(used)
      assert.isFalse(notUsed)
      assert.strictEqual(
        allowance,
        yield* viemRead(() =>
          chain.publicClient.readContract({
            address: chain.token,
            abi: testUsdcAbi,
            functionName: "allowance",
            args: [account.address, PERMIT2_ADDRESS]
          })
        )
      )
      assert.strictEqual(
        word,
        yield* viemRead(() =>
          chain.publicClient.readContract({
            address: PERMIT2_ADDRESS,
            abi: permit2Abi,
            functionName: "nonceBitmap",
            args: [account.address, 0n]
          })
        )
      )
      // The service's own reads go the same way.
      assert.isTrue(yield* chain.authorizationState(account.address, params.nonce))
      assert.isFalse(yield* chain.authorizationState(account.address, unused))
    })
  )

  it.effect("a read that fails fails alone; a turn bigger than a batch sends several", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { batches, counted } = countingPost(chain.rpcUrl)
      const reads = makeQuickReads(counted)
      const owner = chain.demoWallets[1]!.address
      const noCode = getAddress("0x00000000000000000000000000000000000Fee01")
      const [ok, missing, bad] = yield* Effect.all(
        [
          reads.uint("balance", chain.token, () => readCalldata.balanceOf(owner)),
          Effect.flip(reads.uint("balance", noCode, () => readCalldata.balanceOf(owner))),
          Effect.flip(
            reads.bool("state", chain.token, () => readCalldata.authorizationState(owner, "0x1234"))
          )
        ],
        { concurrency: "unbounded" }
      )
      assert.strictEqual(ok, yield* chain.balanceOf(owner))
      assert.strictEqual(missing.reason, "Rpc", "no contract there: no word to read")
      assert.strictEqual(bad.reason, "Invalid", "a nonce that is not 32 bytes is never sent")
      assert.deepStrictEqual(batches, [2])

      const many = QUICK_BATCH_LIMIT + 3
      const answers = yield* Effect.forEach(
        Array.from({ length: many }, () => owner),
        (address) => reads.uint("balance", chain.token, () => readCalldata.balanceOf(address)),
        { concurrency: "unbounded" }
      )
      assert.strictEqual(answers.length, many)
      assert.isTrue(answers.every((answer) => answer === ok))
      assert.deepStrictEqual(batches.slice(1), [QUICK_BATCH_LIMIT, 3])
    })
  )

  it.effect("send puts the reads asked for so far on the wire at once, before the turn's CPU work", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const { batches, counted } = countingPost(chain.rpcUrl)
      const reads = makeQuickReads(counted)
      const owner = chain.demoWallets[2]!.address
      // As the payment verifier starts them: forked at once, each through the service's bound.
      const inFlight = yield* Effect.all(
        [
          quickCall(
            "balance",
            reads.uint("balance", chain.token, () => readCalldata.balanceOf(owner))
          ),
          quickCall(
            "state",
            reads.bool("state", chain.token, () =>
              readCalldata.authorizationState(owner, randomAuthorizationNonce())
            )
          )
        ],
        { concurrency: "unbounded" }
      ).pipe(Effect.forkChild({ startImmediately: true }))
      assert.deepStrictEqual(batches, [], "unsent: the batch waits for the end of the turn")
      reads.send()
      assert.deepStrictEqual(batches, [2], "sent within the turn, both reads in one request")
      const [balance, used] = yield* Fiber.join(inFlight)
      assert.strictEqual(balance, yield* chain.balanceOf(owner))
      assert.isFalse(used)
      // Nothing queued: nothing sent, now or when the turn's own flush runs.
      reads.send()
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 20)))
      assert.deepStrictEqual(batches, [2])
    })
  )

  it.effect("an unreachable node fails every read of the batch; a silent one times each out", () =>
    Effect.gen(function* () {
      const reads = makeQuickReads(httpPost("http://127.0.0.1:9/", QUICK_READ_TIMEOUT_MS))
      const owner = getAddress("0x000000000000000000000000000000000000dEaD")
      const failures = yield* Effect.all(
        [
          Effect.flip(reads.uint("balance", owner, () => readCalldata.balanceOf(owner))),
          Effect.flip(
            reads.bool("state", owner, () => readCalldata.authorizationState(owner, `0x${"11".repeat(32)}`))
          )
        ],
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(
        failures.map((failure) => failure.reason),
        ["Rpc", "Rpc"]
      )
      // A node that takes the request and never answers: each read fails Timeout within the bound.
      const silent = createServer(() => {})
      yield* Effect.acquireRelease(
        Effect.callback<void>((resume) => {
          silent.listen(0, "127.0.0.1", () => resume(Effect.void))
        }),
        () => Effect.sync(() => silent.close())
      )
      const port = (silent.address() as AddressInfo).port
      const late = makeQuickReads(httpPost(`http://127.0.0.1:${port}/`, 200))
      const timedOut = yield* Effect.all(
        [
          Effect.flip(late.uint("balance", owner, () => readCalldata.balanceOf(owner))),
          Effect.flip(late.uint("balance", owner, () => readCalldata.balanceOf(owner)))
        ],
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(
        timedOut.map((failure) => failure.reason),
        ["Timeout", "Timeout"]
      )
    })
  )
})
