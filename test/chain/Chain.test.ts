import { assert, describe, it, layer } from "@effect/vitest"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { ConfigProvider, Effect, Layer, Schema } from "effect"
import {
  type Address,
  domainSeparator,
  getAddress,
  type Hex,
  hexToBigInt,
  numberToHex,
  size,
  slice,
  toHex,
  zeroHash
} from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { testUsdcAbi } from "../../src/chain/artifacts.ts"
import {
  Chain,
  type ChainError,
  DEMO_WALLET_FUNDING,
  randomAuthorizationNonce,
  signTransferAuthorization,
  verifyTransferAuthorization
} from "../../src/chain/Chain.ts"
import { devAccount } from "../../src/chain/DevAccounts.ts"
import { sendNow, submit } from "../support/ChainSend.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

// fresh: layers are memoized by identity, and this one must not reuse the block's shared embedded Chain.
const chainFromEnv = (env: Record<string, string>) =>
  Layer.fresh(Chain.layer).pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord(env))))

const devKey = (index: number) => toHex(devAccount(index).getHdKey().privateKey!)

const HexString = Schema.TemplateLiteral(["0x", Schema.String]).check(Schema.isPattern(/^0x[0-9a-fA-F]*$/))
const X402ExactPayload = Schema.Struct({
  authorization: Schema.Struct({
    from: Schema.String,
    to: Schema.String,
    value: Schema.String,
    validAfter: Schema.String,
    validBefore: Schema.String,
    nonce: HexString
  }),
  signature: HexString
})

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n

const latestTimestamp = Effect.gen(function* () {
  const chain = yield* Chain
  const block = yield* Effect.promise(() => chain.publicClient.getBlock())
  return block.timestamp
})

/** A demo wallet's signed authorization to pay `value` to the treasury, valid for an hour. */
const authorize = Effect.fn(function* (
  walletIndex: number,
  value: bigint,
  overrides: { readonly validBefore?: bigint; readonly to?: Address } = {}
) {
  const chain = yield* Chain
  const wallet = chain.demoWallets[walletIndex]!
  const account = privateKeyToAccount(wallet.privateKey!)
  const now = yield* latestTimestamp
  const params = {
    token: chain.token,
    chainId: chain.chainId,
    domain: chain.tokenDomain,
    to: overrides.to ?? chain.treasury,
    value,
    validAfter: 0n,
    validBefore: overrides.validBefore ?? now + 3600n,
    nonce: randomAuthorizationNonce()
  }
  const signature = yield* Effect.promise(() => signTransferAuthorization(account, params))
  return { ...params, from: account.address, signature }
})

const expectChainError = <A>(effect: Effect.Effect<A, ChainError, Chain>) =>
  Effect.flip(effect).pipe(Effect.map((error) => ({ reason: error.reason, message: error.message })))

layer(ChainEmbedded, { timeout: "60 seconds" })("Chain (embedded Anvil)", (it) => {
  it.effect("deploys the token and the anchor and funds the demo wallets", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      assert.strictEqual(chain.mode, "embedded")
      assert.strictEqual(chain.chainId, 31337)
      assert.strictEqual(chain.network, "eip155:31337")
      assert.deepStrictEqual(chain.tokenDomain, { name: "USD Coin", version: "2" })
      assert.strictEqual(chain.routerSigner, "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266")
      assert.strictEqual(chain.treasury, "0x70997970C51812dc3A010C7d01b50e0d17dc79C8")
      assert.strictEqual(chain.demoWallets.length, 8)
      const read = <const F extends "decimals" | "symbol" | "DOMAIN_SEPARATOR">(functionName: F) =>
        Effect.promise(() =>
          chain.publicClient.readContract({ address: chain.token, abi: testUsdcAbi, functionName })
        )
      assert.strictEqual(yield* read("decimals"), 6)
      assert.strictEqual(
        yield* read("DOMAIN_SEPARATOR"),
        domainSeparator({
          domain: { name: "USD Coin", version: "2", chainId: 31337, verifyingContract: chain.token }
        })
      )
      for (const wallet of chain.demoWallets) {
        assert.strictEqual(yield* chain.balanceOf(wallet.address), DEMO_WALLET_FUNDING)
        // the keys are the public dev mnemonic's, and they match the addresses
        assert.strictEqual(privateKeyToAccount(wallet.privateKey!).address, wallet.address)
      }
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), 0n)
      assert.isTrue((yield* chain.blockNumber()) > 0n)
    })
  )

  it.effect("settles a demo wallet's transferWithAuthorization submitted by the router", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const payment = yield* authorize(0, 1_250_000n)
      const treasuryBefore = yield* chain.balanceOf(chain.treasury)
      const payerBefore = yield* chain.balanceOf(payment.from)
      const routerEthBefore = yield* Effect.promise(() =>
        chain.publicClient.getBalance({ address: chain.routerSigner })
      )
      assert.isFalse(yield* chain.authorizationState(payment.from, payment.nonce))
      yield* chain.simulateTransferWithAuthorization(payment)
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore, "a simulation moves nothing")

      const hash = yield* submit(chain, payment)
      const outcome = yield* chain.waitForReceipt(hash)

      assert.strictEqual(outcome.status, "success")
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore + 1_250_000n)
      assert.strictEqual(yield* chain.balanceOf(payment.from), payerBefore - 1_250_000n)
      assert.isTrue(yield* chain.authorizationState(payment.from, payment.nonce))
      const routerEthAfter = yield* Effect.promise(() =>
        chain.publicClient.getBalance({ address: chain.routerSigner })
      )
      assert.isTrue(routerEthAfter < routerEthBefore, "the router pays the gas")

      const logs = yield* chain.readTransferLogs({
        fromBlock: outcome.blockNumber,
        toBlock: outcome.blockNumber,
        to: chain.treasury
      })
      assert.deepStrictEqual(
        logs.map(({ from, to, value, txHash }) => ({ from, to, value, txHash })),
        [{ from: payment.from, to: chain.treasury, value: 1_250_000n, txHash: hash }]
      )

      // replaying the same authorization is refused and moves nothing
      const simulatedReplay = yield* expectChainError(chain.simulateTransferWithAuthorization(payment))
      assert.strictEqual(simulatedReplay.reason, "Reverted")
      assert.include(simulatedReplay.message, "authorization is used or canceled")
      const replay = yield* expectChainError(submit(chain, payment))
      assert.strictEqual(replay.reason, "Reverted")
      assert.include(replay.message, "authorization is used or canceled")
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore + 1_250_000n)
    })
  )

  it.effect("rejects expired, tampered and malleable authorizations", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const now = yield* latestTimestamp

      const expired = yield* authorize(1, 1_000_000n, { validBefore: now })
      assert.include(
        (yield* expectChainError(chain.simulateTransferWithAuthorization(expired))).message,
        "authorization is expired"
      )
      const expiredError = yield* expectChainError(submit(chain, expired))
      assert.deepStrictEqual(expiredError.reason, "Reverted")
      assert.include(expiredError.message, "authorization is expired")

      // redirecting a signed payment elsewhere invalidates the signature
      const signed = yield* authorize(1, 1_000_000n)
      const redirected = { ...signed, to: chain.routerSigner }
      assert.isTrue(yield* Effect.promise(() => verifyTransferAuthorization(signed)))
      assert.isFalse(yield* Effect.promise(() => verifyTransferAuthorization(redirected)))
      assert.include((yield* expectChainError(submit(chain, redirected))).message, "invalid signature")

      // the high-s twin of a valid signature recovers the same signer but must be refused
      const s = hexToBigInt(slice(signed.signature, 32, 64))
      const v = Number(hexToBigInt(slice(signed.signature, 64, 65)))
      const twin: Hex = `${slice(signed.signature, 0, 32)}${numberToHex(SECP256K1_N - s, { size: 32 }).slice(2)}${numberToHex(v === 27 ? 28 : 27, { size: 1 }).slice(2)}`
      assert.strictEqual(size(twin), 65)
      assert.include(
        (yield* expectChainError(submit(chain, { ...signed, signature: twin }))).message,
        "invalid signature"
      )

      assert.isFalse(yield* chain.authorizationState(signed.from, signed.nonce))
      assert.strictEqual(yield* chain.balanceOf(signed.from), DEMO_WALLET_FUNDING)
    })
  )

  it.effect("settles a payment signed by the official x402 exact client", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const payer = privateKeyToAccount(chain.demoWallets[1]!.privateKey!)
      const client = new ExactEvmScheme(payer)
      const result = yield* Effect.promise(() =>
        client.createPaymentPayload(2, {
          scheme: "exact",
          network: chain.network,
          asset: chain.token,
          amount: "42000",
          payTo: chain.treasury,
          maxTimeoutSeconds: 300,
          extra: { ...chain.tokenDomain }
        })
      )
      const { authorization: a, signature } = Schema.decodeUnknownSync(X402ExactPayload)(result.payload)
      const treasuryBefore = yield* chain.balanceOf(chain.treasury)
      const hash = yield* submit(chain, {
        from: getAddress(a.from),
        to: getAddress(a.to),
        value: BigInt(a.value),
        validAfter: BigInt(a.validAfter),
        validBefore: BigInt(a.validBefore),
        nonce: a.nonce,
        signature
      })
      assert.strictEqual((yield* chain.waitForReceipt(hash)).status, "success")
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore + 42_000n)
    })
  )

  it.effect("accepts the bytes-signature overload of transferWithAuthorization", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const payment = yield* authorize(2, 500_000n)
      const simulated = yield* Effect.promise(() =>
        chain.publicClient.simulateContract({
          account: chain.routerSigner,
          address: chain.token,
          abi: testUsdcAbi,
          functionName: "transferWithAuthorization",
          args: [
            payment.from,
            payment.to,
            payment.value,
            payment.validAfter,
            payment.validBefore,
            payment.nonce,
            payment.signature
          ]
        })
      )
      assert.strictEqual(simulated.request.functionName, "transferWithAuthorization")
    })
  )

  it.effect("pays refunds from the treasury", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const recipient = chain.demoWallets[0]!.address
      const before = yield* chain.balanceOf(recipient)
      const treasuryBefore = yield* chain.balanceOf(chain.treasury)
      const outcome = yield* chain.waitForReceipt(
        yield* sendNow(chain, chain.calls.treasuryTransfer(recipient, 250_000n))
      )
      assert.strictEqual(outcome.status, "success")
      assert.strictEqual(yield* chain.balanceOf(recipient), before + 250_000n)
      assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore - 250_000n)

      const overdraw = yield* expectChainError(
        sendNow(chain, chain.calls.treasuryTransfer(recipient, treasuryBefore))
      )
      assert.strictEqual(overdraw.reason, "Reverted")
      assert.include(overdraw.message, "exceeds balance")
    })
  )

  it.effect("external mode uses the configured RPC, contracts and keys", () =>
    Effect.gen(function* () {
      const embedded = yield* Chain
      const env = {
        RPC_URL: embedded.rpcUrl,
        CHAIN_ID: "31337",
        ROUTER_PRIVATE_KEY: devKey(0),
        TREASURY_ADDRESS: embedded.treasury.toLowerCase(),
        TOKEN_ADDRESS: embedded.token,
        ANCHOR_ADDRESS: embedded.anchor
      }
      const external = yield* Chain.useSync((chain) => chain).pipe(Effect.provide(chainFromEnv(env)))
      assert.strictEqual(external.mode, "external")
      assert.strictEqual(external.treasury, embedded.treasury)
      assert.strictEqual(external.routerSigner, embedded.routerSigner)
      assert.deepStrictEqual(external.tokenDomain, { name: "USD Coin", version: "2" })
      assert.deepStrictEqual(external.demoWallets, [])
      assert.strictEqual(
        yield* external.balanceOf(embedded.demoWallets[0]!.address),
        yield* embedded.balanceOf(embedded.demoWallets[0]!.address)
      )

      const misconfigured = (overrides: Record<string, string>) =>
        Chain.useSync((chain) => chain).pipe(
          Effect.provide(chainFromEnv({ ...env, ...overrides })),
          Effect.flip,
          Effect.map((error) =>
            error._tag === "ChainError" ? `${error.reason}: ${error.message}` : error._tag
          )
        )
      assert.match(yield* misconfigured({ CHAIN_ID: "8453" }), /^Config: CHAIN_ID is 8453/)
      const wrongTreasuryKey = devKey(5)
      const treasuryMismatch = yield* misconfigured({ TREASURY_PRIVATE_KEY: wrongTreasuryKey })
      assert.match(treasuryMismatch, /^Config: TREASURY_PRIVATE_KEY does not belong/)
      assert.notInclude(treasuryMismatch, wrongTreasuryKey.slice(2))
      assert.match(
        yield* misconfigured({ ROUTER_PRIVATE_KEY: devKey(2) }),
        /^Config: ANCHOR_ADDRESS is owned by/
      )
      assert.strictEqual(
        yield* misconfigured({ ROUTER_PRIVATE_KEY: "0x1234" }),
        "Config: ROUTER_PRIVATE_KEY is not a 32-byte hex private key"
      )
    })
  )

  it.effect("anchors an epoch root exactly once", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const root: Hex = `0x${"ab".repeat(32)}`
      assert.strictEqual(yield* chain.anchoredRoot(7n), zeroHash)

      const outcome = yield* chain.waitForReceipt(yield* sendNow(chain, chain.calls.anchor(7n, root)))
      assert.strictEqual(outcome.status, "success")
      assert.strictEqual(yield* chain.anchoredRoot(7n), root)
      assert.strictEqual(yield* chain.anchoredRoot(8n), zeroHash)

      const again = yield* expectChainError(sendNow(chain, chain.calls.anchor(7n, `0x${"cd".repeat(32)}`)))
      assert.strictEqual(again.reason, "Reverted")
      assert.include(again.message, "epoch already anchored")
      assert.strictEqual(yield* chain.anchoredRoot(7n), root)

      const outOfRange = yield* expectChainError(sendNow(chain, chain.calls.anchor(2n ** 64n, root)))
      assert.strictEqual(outOfRange.reason, "Invalid")
    })
  )
})

describe("Chain.layer lifecycle", () => {
  it.live("stops its Anvil when the layer's scope closes", () =>
    Effect.gen(function* () {
      const rpcUrl = yield* Effect.gen(function* () {
        const chain = yield* Chain
        assert.isTrue((yield* chain.blockNumber()) > 0n)
        return chain.rpcUrl
      }).pipe(Effect.provide(ChainEmbedded))
      const answer = yield* Effect.promise(() =>
        fetch(rpcUrl, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] })
        }).then(
          () => "answered",
          () => "refused"
        )
      )
      assert.strictEqual(answer, "refused")
    })
  )
})
