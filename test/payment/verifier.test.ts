import { assert, layer } from "@effect/vitest"
import { x402Client, x402HTTPClient } from "@x402/core/client"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { Clock, ConfigProvider, Effect, Layer } from "effect"
import { type Address, type Hex, hexToBigInt, type LocalAccount, numberToHex, slice } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import {
  Chain,
  ChainError,
  randomAuthorizationNonce,
  signTransferAuthorization,
  type TokenDomain
} from "../../src/chain/Chain.ts"
import {
  type PaymentRequired,
  type PaymentRequiredCode,
  paymentRequiredHeader
} from "../../src/domain/X402.ts"
import { checkPaymentSignature, type SignatureCheck } from "../../src/payment/PaymentSignature.ts"
import { PaymentVerifier, type VerifiedPayment } from "../../src/payment/PaymentVerifier.ts"
import { X402Config } from "../../src/payment/X402.ts"
import { submit } from "../support/ChainSend.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))
const Limits = X402Config.layerTest({
  soloSettleFloor: 10_000,
  paymentCap: 50_000_000,
  maxTimeoutSeconds: 300
})
const TestLayer = PaymentVerifier.layer.pipe(Layer.provideMerge(Layer.merge(ChainEmbedded, Limits)))

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
const DAY = 24n * 3600n
const RESOURCE = "http://router.test/v1/chat/completions"

const nowSeconds = Clock.currentTimeMillis.pipe(Effect.map((ms) => BigInt(Math.floor(ms / 1000))))

const demoAccount = (index: number) =>
  Chain.useSync((chain) => privateKeyToAccount(chain.demoWallets[index]!.privateKey!))

interface SignOptions {
  readonly value?: bigint
  readonly to?: Address
  readonly validAfter?: bigint
  readonly validBefore?: bigint
  readonly domain?: TokenDomain
}

/** A TransferWithAuthorization signed with viem, as a wallet following spec 5.2 would sign it. */
const sign = Effect.fn(function* (account: LocalAccount, options: SignOptions = {}) {
  const chain = yield* Chain
  const now = yield* nowSeconds
  const params = {
    token: chain.token,
    chainId: chain.chainId,
    domain: options.domain ?? chain.tokenDomain,
    to: options.to ?? chain.treasury,
    value: options.value ?? 100_000n,
    validAfter: options.validAfter ?? 0n,
    validBefore: options.validBefore ?? now + 600n,
    nonce: randomAuthorizationNonce()
  }
  const signature = yield* Effect.promise(() => signTransferAuthorization(account, params))
  return { from: account.address, ...params, signature }
})

type Signed = Effect.Success<ReturnType<typeof sign>>

const wire = (p: Pick<Signed, "from" | "to" | "value" | "validAfter" | "validBefore" | "nonce">) => ({
  from: p.from,
  to: p.to,
  value: p.value.toString(),
  validAfter: p.validAfter.toString(),
  validBefore: p.validBefore.toString(),
  nonce: p.nonce
})

/** The spec's flat envelope, base64 as it travels in `PAYMENT-SIGNATURE`. */
const flatHeader = (p: Signed, overrides: Record<string, unknown> = {}) =>
  Buffer.from(
    JSON.stringify({
      x402Version: 2,
      scheme: "exact",
      network: "eip155:31337",
      payload: { authorization: wire(p), signature: p.signature },
      ...overrides
    })
  ).toString("base64")

const verify = (header: string, worstCase = 100_000, signed?: SignatureCheck) =>
  PaymentVerifier.use((verifier) =>
    verifier.verifyExact({
      header,
      worstCase,
      resourceUrl: RESOURCE,
      description: "chat completion",
      signed
    })
  )

/**
 * Runs a verification that must be refused and checks what every refusal owes the caller: the 402 code,
 * `accepts` to sign again, and no money moved (payer and treasury balances, the token's nonce state).
 */
const expectRejected = Effect.fn(function* (
  payer: Address,
  nonce: Hex | undefined,
  code: PaymentRequiredCode,
  run: Effect.Effect<VerifiedPayment, PaymentRequired, PaymentVerifier>
) {
  const chain = yield* Chain
  const payerBefore = yield* chain.balanceOf(payer)
  const treasuryBefore = yield* chain.balanceOf(chain.treasury)
  const rejection = yield* Effect.flip(run)
  assert.strictEqual(rejection._tag, "PaymentRequired")
  assert.strictEqual(rejection.code, code, rejection.error)
  assert.strictEqual(rejection.x402Version, 2)
  assert.lengthOf(rejection.accepts, 1)
  assert.strictEqual(rejection.accepts[0]!.payTo, chain.treasury)
  assert.strictEqual(rejection.accepts[0]!.asset, chain.token)
  assert.strictEqual(yield* chain.balanceOf(payer), payerBefore, "the payer's balance is unchanged")
  assert.strictEqual(yield* chain.balanceOf(chain.treasury), treasuryBefore, "the treasury received nothing")
  if (nonce !== undefined) assert.isFalse(yield* chain.authorizationState(payer, nonce), "nonce still unused")
  return rejection
})

layer(TestLayer, { timeout: "90 seconds", excludeTestServices: true })(
  "PaymentVerifier.verifyExact",
  (it) => {
    it.effect("passes a demo wallet's viem-signed payment without moving money", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const payment = yield* sign(yield* demoAccount(0), { value: 150_000n })
        const balanceBefore = yield* chain.balanceOf(payment.from)
        const verified = yield* verify(flatHeader(payment), 150_000)
        assert.deepStrictEqual(verified, {
          scheme: "exact",
          payer: payment.from,
          value: 150_000n,
          authorization: {
            from: payment.from,
            to: chain.treasury,
            value: 150_000n,
            validAfter: 0n,
            validBefore: payment.validBefore,
            nonce: payment.nonce
          },
          signature: payment.signature,
          network: "eip155:31337",
          balance: balanceBefore
        })
        assert.strictEqual(yield* chain.balanceOf(payment.from), balanceBefore)
        assert.isFalse(yield* chain.authorizationState(payment.from, payment.nonce))
        // what passed is exactly what the token will accept when the router settles it
        yield* chain.simulateTransferWithAuthorization({
          ...verified.authorization,
          signature: verified.signature
        })
      })
    )

    it.effect("passes a payment signed by the official x402 v2 client from our PAYMENT-REQUIRED", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const verifier = yield* PaymentVerifier
        const account = yield* demoAccount(1)
        const required = verifier.quote({
          worstCase: 42_000,
          resourceUrl: RESOURCE,
          description: "chat completion"
        })
        const header = paymentRequiredHeader(required)
        const client = new x402Client()
          .register(chain.network, new ExactEvmScheme(account))
          .setSpendControls({
            allowedAssets: [{ network: chain.network, asset: chain.token, maxAmountPerPayment: "1000000" }]
          })
        const http = new x402HTTPClient(client)
        const signatureHeader = yield* Effect.promise(() =>
          http
            .createPaymentPayload(
              http.getPaymentRequiredResponse((name) =>
                name.toLowerCase() === "payment-required" ? header : null
              )
            )
            .then((payload) => http.encodePaymentSignatureHeader(payload)["PAYMENT-SIGNATURE"]!)
        )
        const verified = yield* verify(signatureHeader, 42_000)
        assert.strictEqual(verified.payer, account.address)
        assert.strictEqual(verified.value, 42_000n)
        assert.strictEqual(verified.authorization.to, chain.treasury)
        yield* chain.simulateTransferWithAuthorization({
          ...verified.authorization,
          signature: verified.signature
        })
      })
    )

    it.effect("a) a worst case above the cap: payment_limit", () =>
      Effect.gen(function* () {
        const payment = yield* sign(yield* demoAccount(0), { value: 60_000_000n })
        const rejection = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_limit",
          verify(flatHeader(payment), 60_000_000)
        )
        assert.include(rejection.hint ?? "", "max_tokens")
      })
    )

    it.effect("b) a malformed envelope or another x402 version: payment_invalid", () =>
      Effect.gen(function* () {
        const payment = yield* sign(yield* demoAccount(0))
        const garbage = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_invalid",
          verify("%%garbage%%")
        )
        assert.include(garbage.error, "base64")
        const missing = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_invalid",
          verify(flatHeader(payment, { payload: { authorization: wire(payment) } }))
        )
        assert.include(missing.error, "payload.signature")
        assert.notInclude(missing.error, payment.nonce.slice(2))
        const v1 = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_invalid",
          verify(flatHeader(payment, { x402Version: 1 }))
        )
        assert.include(v1.error, "x402Version")
      })
    )

    it.effect("c) another scheme: wrong_scheme, with accepts to sign exact", () =>
      Effect.gen(function* () {
        const payment = yield* sign(yield* demoAccount(0))
        const upto = Buffer.from(
          JSON.stringify({
            x402Version: 2,
            accepted: { scheme: "upto", network: "eip155:31337", amount: "100000" },
            payload: { signature: payment.signature, permit2Authorization: { from: payment.from } }
          })
        ).toString("base64")
        const rejection = yield* expectRejected(payment.from, payment.nonce, "wrong_scheme", verify(upto))
        assert.strictEqual(rejection.accepts[0]!.scheme, "exact")
        yield* expectRejected(
          payment.from,
          payment.nonce,
          "wrong_scheme",
          verify(flatHeader(payment, { scheme: "upto" }))
        )
      })
    )

    it.effect("d) another network: payment_invalid", () =>
      Effect.gen(function* () {
        const payment = yield* sign(yield* demoAccount(0))
        const rejection = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_invalid",
          verify(flatHeader(payment, { network: "eip155:8453" }))
        )
        assert.include(rejection.error, "network")
      })
    )

    it.effect("e) paid to someone other than the treasury: payment_invalid", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const payment = yield* sign(yield* demoAccount(0), { to: chain.routerSigner })
        const rejection = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_invalid",
          verify(flatHeader(payment))
        )
        assert.include(rejection.error, "treasury")
      })
    )

    it.effect("e2) a v2 envelope naming another asset or recipient under accepted: payment_invalid", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        // The signature is valid for the real token and treasury; only the echoed requirements lie.
        const accepted = (overrides: Record<string, unknown>) => ({
          scheme: "exact",
          network: chain.network,
          amount: "100000",
          asset: chain.token,
          payTo: chain.treasury,
          maxTimeoutSeconds: 300,
          extra: { name: chain.tokenDomain.name, version: chain.tokenDomain.version },
          ...overrides
        })
        const nested = (p: Signed, overrides: Record<string, unknown>) =>
          Buffer.from(
            JSON.stringify({
              x402Version: 2,
              accepted: accepted(overrides),
              payload: { authorization: wire(p), signature: p.signature }
            })
          ).toString("base64")
        const bogusAsset = yield* sign(yield* demoAccount(0))
        const wrongAsset = yield* expectRejected(
          bogusAsset.from,
          bogusAsset.nonce,
          "payment_invalid",
          verify(nested(bogusAsset, { asset: "0x000000000000000000000000000000000000dEaD" }))
        )
        assert.include(wrongAsset.error, "accepted.asset")
        const bogusPayTo = yield* sign(yield* demoAccount(0))
        const wrongPayTo = yield* expectRejected(
          bogusPayTo.from,
          bogusPayTo.nonce,
          "payment_invalid",
          verify(nested(bogusPayTo, { payTo: chain.routerSigner }))
        )
        assert.include(wrongPayTo.error, "accepted.payTo")
        // The same envelope naming the quoted asset (in any letter case) and recipient passes.
        const honest = yield* sign(yield* demoAccount(0))
        const verified = yield* verify(nested(honest, { asset: chain.token.toLowerCase() }))
        assert.strictEqual(verified.payer, honest.from)
      })
    )

    it.effect("f) below the solo settlement floor: solo_settle_floor, session_required and the floor", () =>
      Effect.gen(function* () {
        const payment = yield* sign(yield* demoAccount(0), { value: 9_999n })
        const rejection = yield* expectRejected(
          payment.from,
          payment.nonce,
          "solo_settle_floor",
          verify(flatHeader(payment), 1_000)
        )
        assert.isTrue(rejection.session_required)
        assert.strictEqual(rejection.floor, "10000")
        assert.strictEqual(rejection.accepts[0]!.amount, "10000", "the quote asks for the floor")
      })
    )

    it.effect("g) below the quoted worst case: payment_invalid", () =>
      Effect.gen(function* () {
        const payment = yield* sign(yield* demoAccount(0), { value: 99_999n })
        const rejection = yield* expectRejected(
          payment.from,
          payment.nonce,
          "payment_invalid",
          verify(flatHeader(payment), 100_000)
        )
        assert.strictEqual(rejection.error, "signed amount below the quoted maximum")
        assert.strictEqual(rejection.accepts[0]!.amount, "100000")
      })
    )

    it.effect("h) signing windows: not yet valid, too little runway, beyond 7 days", () =>
      Effect.gen(function* () {
        const account = yield* demoAccount(0)
        const now = yield* nowSeconds
        const early = yield* sign(account, { validAfter: now + 60n })
        const earlyRejection = yield* expectRejected(
          early.from,
          early.nonce,
          "payment_invalid",
          verify(flatHeader(early))
        )
        assert.include(earlyRejection.error, "validAfter")

        const short = yield* sign(account, { validBefore: now + 60n })
        const shortRejection = yield* expectRejected(
          short.from,
          short.nonce,
          "payment_invalid",
          verify(flatHeader(short))
        )
        assert.include(shortRejection.error, "validBefore")
        assert.include(shortRejection.error, "120 seconds")

        const long = yield* sign(account, { validBefore: now + 8n * DAY })
        const longRejection = yield* expectRejected(
          long.from,
          long.nonce,
          "payment_invalid",
          verify(flatHeader(long))
        )
        assert.include(longRejection.error, "7 days")

        // inside the skew allowance on every edge: passes
        const edges = yield* sign(account, { validAfter: now + 2n, validBefore: now + 7n * DAY })
        yield* verify(flatHeader(edges))
        const runway = yield* sign(account, { validBefore: now + 120n })
        yield* verify(flatHeader(runway))
      })
    )

    it.effect("i) a signature that does not recover to from: payment_invalid", () =>
      Effect.gen(function* () {
        const victim = yield* demoAccount(0)
        const thief = yield* sign(yield* demoAccount(1))
        const forged = { ...thief, from: victim.address }
        const forgedRejection = yield* expectRejected(
          victim.address,
          forged.nonce,
          "payment_invalid",
          verify(flatHeader(forged))
        )
        assert.include(forgedRejection.error, "signature")

        const otherDomain = yield* sign(victim, { domain: { name: "USD Coin", version: "1" } })
        yield* expectRejected(
          victim.address,
          otherDomain.nonce,
          "payment_invalid",
          verify(flatHeader(otherDomain))
        )

        const tampered = yield* sign(victim, { value: 100_000n })
        yield* expectRejected(
          victim.address,
          tampered.nonce,
          "payment_invalid",
          verify(flatHeader({ ...tampered, value: 1_000_000n }))
        )

        // the high-s twin recovers the same signer, but the token would refuse it at settlement
        const signed = yield* sign(victim)
        const s = hexToBigInt(slice(signed.signature, 32, 64))
        const v = Number(hexToBigInt(slice(signed.signature, 64, 65)))
        const twin: Hex = `${slice(signed.signature, 0, 32)}${numberToHex(SECP256K1_N - s, { size: 32 }).slice(2)}${numberToHex(v === 27 ? 28 : 27, { size: 1 }).slice(2)}`
        yield* expectRejected(
          victim.address,
          signed.nonce,
          "payment_invalid",
          verify(flatHeader({ ...signed, signature: twin }))
        )
        // the low-s original passes
        yield* verify(flatHeader(signed))
      })
    )

    // A nonce used here is the reservation's to refuse (its primary key, D381; test/payment/reserve.test.ts
    // and test/payment/signedOnce.test.ts): the verifier reads only the token's record.
    it.effect("j) a nonce already used on the token: payment_invalid", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        // settled once on chain (this setup step moves money); verifying it again must not
        const settled = yield* sign(yield* demoAccount(2))
        const receipt = yield* chain.waitForReceipt(
          yield* submit(chain, { ...settled, signature: settled.signature })
        )
        assert.strictEqual(receipt.status, "success")
        assert.isTrue(yield* chain.authorizationState(settled.from, settled.nonce))
        const replay = yield* expectRejected(
          settled.from,
          undefined,
          "payment_invalid",
          verify(flatHeader(settled))
        )
        assert.strictEqual(replay.error, "authorization already used")
      })
    )

    it.effect("a carried signature check answers for its own header only, and is taken for it", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const victim = yield* demoAccount(0)
        const genuine = yield* sign(victim)
        const forged = { ...(yield* sign(yield* demoAccount(1))), from: victim.address }
        const genuineCheck = yield* checkPaymentSignature(chain, flatHeader(genuine))
        const forgedCheck = yield* checkPaymentSignature(chain, flatHeader(forged))
        assert.deepStrictEqual(genuineCheck, {
          header: flatHeader(genuine),
          payer: victim.address,
          valid: true
        })
        assert.deepStrictEqual(forgedCheck, {
          header: flatHeader(forged),
          payer: victim.address,
          valid: false
        })
        assert.isUndefined(yield* checkPaymentSignature(chain, "%%garbage%%"))

        // A check of another header says nothing about this one: the forgery is checked, and refused.
        const refused = yield* expectRejected(
          victim.address,
          forged.nonce,
          "payment_invalid",
          verify(flatHeader(forged), 100_000, genuineCheck!)
        )
        assert.include(refused.error, "signature")
        // Nor does a check claiming validity for another header: it is still this header's own check.
        yield* expectRejected(
          victim.address,
          forged.nonce,
          "payment_invalid",
          verify(flatHeader(forged), 100_000, { ...genuineCheck!, header: `${flatHeader(forged)} ` })
        )
        // The check of this very header is taken as it is (no second check): a refusal carried for the
        // genuine header refuses it, and the forgery's own refusal refuses it.
        yield* expectRejected(
          victim.address,
          genuine.nonce,
          "payment_invalid",
          verify(flatHeader(genuine), 100_000, { ...genuineCheck!, valid: false })
        )
        yield* expectRejected(
          victim.address,
          forged.nonce,
          "payment_invalid",
          verify(flatHeader(forged), 100_000, forgedCheck!)
        )
        const verified = yield* verify(flatHeader(genuine), 100_000, genuineCheck!)
        assert.strictEqual(verified.payer, victim.address)
      })
    )

    it.effect("k) a payer without the funds: payment_invalid", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const pauper = privateKeyToAccount(generatePrivateKey())
        assert.strictEqual(yield* chain.balanceOf(pauper.address), 0n)
        const payment = yield* sign(pauper)
        const rejection = yield* expectRejected(
          pauper.address,
          payment.nonce,
          "payment_invalid",
          verify(flatHeader(payment))
        )
        assert.strictEqual(rejection.error, "insufficient balance")
      })
    )

    it.effect(
      "k) the balance read failing: payment_verification_unavailable, retryable, signature kept",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          // The one stand-in in these tests: the real chain with its balance read failing as an RPC outage would.
          const rpcDown = Layer.succeed(Chain, {
            ...chain,
            balanceOf: () => Effect.fail(new ChainError({ reason: "Rpc", message: "Chain.balanceOf failed" }))
          })
          // fresh: layers are memoized by identity, and this one must not reuse the block's verifier.
          const verifierWithoutRpc = Layer.fresh(PaymentVerifier.layer).pipe(
            Layer.provide(Layer.merge(rpcDown, Limits))
          )
          const payment = yield* sign(yield* demoAccount(3))
          const header = flatHeader(payment)
          const rejection = yield* expectRejected(
            payment.from,
            payment.nonce,
            "payment_verification_unavailable",
            verify(header).pipe(Effect.provide(verifierWithoutRpc))
          )
          assert.isTrue(rejection.retryable)
          // the same signed payment passes once the chain answers again
          const verified = yield* verify(header)
          assert.strictEqual(verified.payer, payment.from)
        })
    )
  }
)
