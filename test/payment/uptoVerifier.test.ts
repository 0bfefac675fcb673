import { assert, layer } from "@effect/vitest"
import type { PaymentRequirements } from "@x402/core/types"
import { createPermit2ApprovalTx, UptoEvmScheme } from "@x402/evm/upto/client"
import { Clock, ConfigProvider, Effect, Layer } from "effect"
import { createWalletClient, http, type LocalAccount, publicActions, toHex } from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { Chain, ChainError } from "../../src/chain/Chain.ts"
import { devAccount } from "../../src/chain/DevAccounts.ts"
import { signUptoPermit, type UptoPermitFields, uptoSettleCall } from "../../src/chain/UptoPermit.ts"
import type { PaymentRequired, PaymentRequiredCode } from "../../src/domain/X402.ts"
import { uptoNonceKey } from "../../src/ledger/Ledger.ts"
import { PaymentVerifier, type VerifiedPayment } from "../../src/payment/PaymentVerifier.ts"
import { X402Config } from "../../src/payment/X402.ts"

// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const ChainEmbedded = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))
const Limits = X402Config.layerTest({
  soloSettleFloor: 10_000,
  paymentCap: 50_000_000,
  uptoTimeoutSeconds: 3600
})
const TestLayer = PaymentVerifier.layer.pipe(Layer.provideMerge(Layer.merge(ChainEmbedded, Limits)))

const RESOURCE = "http://router.test/v1/chat/completions"
const WORST_CASE = 150_000

const nowSeconds = Clock.currentTimeMillis.pipe(Effect.map((ms) => BigInt(Math.floor(ms / 1000))))
const demoAccount = (index: number) =>
  Chain.useSync((chain) => privateKeyToAccount(chain.demoWallets[index]!.privateKey!))

const walletOf = (chain: typeof Chain.Service, account: LocalAccount) =>
  createWalletClient({ account, chain: chain.publicClient.chain, transport: http(chain.rpcUrl) }).extend(
    publicActions
  )

const approvePermit2 = Effect.fn(function* (account: LocalAccount) {
  const chain = yield* Chain
  const wallet = walletOf(chain, account)
  const hash = yield* Effect.promise(() => wallet.sendTransaction(createPermit2ApprovalTx(chain.token)))
  yield* Effect.promise(() => wallet.waitForTransactionReceipt({ hash }))
})

/** A permit as the official client would sign it for our quote, with any field bent. */
const permitFor = Effect.fn(function* (account: LocalAccount, bend: Partial<UptoPermitFields> = {}) {
  const chain = yield* Chain
  const now = yield* nowSeconds
  const fields: UptoPermitFields = {
    from: account.address,
    permitted: { token: chain.token, amount: BigInt(WORST_CASE) },
    spender: chain.uptoProxy,
    nonce: BigInt(toHex(crypto.getRandomValues(new Uint8Array(32)))),
    deadline: now + 3600n,
    witness: { to: chain.treasury, facilitator: chain.routerSigner, validAfter: 0n },
    ...bend
  }
  const signature = yield* Effect.promise(() => signUptoPermit(account, chain.chainId, fields))
  return { ...fields, signature }
})

type Permit = Effect.Success<ReturnType<typeof permitFor>>

const headerOf = (permit: Permit, network = "eip155:31337") =>
  Buffer.from(
    JSON.stringify({
      x402Version: 2,
      accepted: { scheme: "upto", network, amount: permit.permitted.amount.toString() },
      payload: {
        signature: permit.signature,
        permit2Authorization: {
          from: permit.from,
          permitted: { token: permit.permitted.token, amount: permit.permitted.amount.toString() },
          spender: permit.spender,
          nonce: permit.nonce.toString(),
          deadline: permit.deadline.toString(),
          witness: {
            to: permit.witness.to,
            facilitator: permit.witness.facilitator,
            validAfter: permit.witness.validAfter.toString()
          }
        }
      }
    })
  ).toString("base64")

const verify = (header: string, options: { upto?: boolean; worstCase?: number } = {}) =>
  PaymentVerifier.use((verifier) =>
    verifier.verify({
      header,
      worstCase: options.worstCase ?? WORST_CASE,
      resourceUrl: RESOURCE,
      description: "chat completion",
      upto: options.upto ?? true
    })
  )

/** A refusal owes the caller: its code, `accepts` to sign again, and no money moved (nor the nonce spent). */
const expectRejected = Effect.fn(function* (
  permit: Permit,
  code: PaymentRequiredCode,
  run: Effect.Effect<VerifiedPayment, PaymentRequired, PaymentVerifier>
) {
  const chain = yield* Chain
  const before = yield* Effect.all([chain.balanceOf(permit.from), chain.balanceOf(chain.treasury)])
  const rejection = yield* Effect.flip(run)
  assert.strictEqual(rejection.code, code, rejection.error)
  assert.isAbove(rejection.accepts.length, 0)
  assert.deepStrictEqual(
    yield* Effect.all([chain.balanceOf(permit.from), chain.balanceOf(chain.treasury)]),
    before
  )
  assert.isFalse(yield* chain.permit2NonceUsed(permit.from, permit.nonce), "the Permit2 nonce is unspent")
  return rejection
})

layer(TestLayer, { timeout: "120 seconds", excludeTestServices: true })("PaymentVerifier: upto", (it) => {
  it.effect("passes a payment the official upto client signs from our 402's upto entry", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const account = yield* demoAccount(0)
      yield* approvePermit2(account)
      const verifier = yield* PaymentVerifier
      const quote = verifier.quote({
        worstCase: WORST_CASE,
        resourceUrl: RESOURCE,
        description: "chat",
        upto: true
      })
      assert.deepStrictEqual(
        quote.accepts.map((a) => a.scheme),
        ["exact", "upto"]
      )
      const requirements = quote.accepts[1]! as unknown as PaymentRequirements
      const created = yield* Effect.promise(() =>
        new UptoEvmScheme(account).createPaymentPayload(2, requirements)
      )
      const header = Buffer.from(
        JSON.stringify({ x402Version: 2, accepted: requirements, payload: created.payload })
      ).toString("base64")
      const before = yield* chain.balanceOf(account.address)
      const verified = yield* verify(header)
      assert.strictEqual(verified.scheme, "upto")
      if (verified.scheme !== "upto") return
      assert.strictEqual(verified.payer, account.address)
      assert.strictEqual(verified.value, BigInt(WORST_CASE))
      assert.strictEqual(verified.balance, before)
      assert.strictEqual(verified.nonceKey, uptoNonceKey(verified.authorization.nonce))
      assert.strictEqual(yield* chain.balanceOf(account.address), before)
    })
  )

  it.effect("refuses a permit naming another token, spender, payee or facilitator, or too small", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const account = yield* demoAccount(0)
      const stranger = privateKeyToAccount(generatePrivateKey()).address
      const cases: ReadonlyArray<[Partial<UptoPermitFields>, PaymentRequiredCode, RegExp]> = [
        [{ permitted: { token: chain.anchor, amount: 150_000n } }, "payment_invalid", /permitted.token/],
        [{ spender: stranger }, "payment_invalid", /spender must be the x402 upto proxy/],
        [
          { witness: { to: stranger, facilitator: chain.routerSigner, validAfter: 0n } },
          "payment_invalid",
          /witness.to/
        ],
        [
          { witness: { to: chain.treasury, facilitator: stranger, validAfter: 0n } },
          "payment_invalid",
          /witness.facilitator/
        ],
        [{ permitted: { token: chain.token, amount: 9_999n } }, "solo_settle_floor", /solo settlement floor/],
        [
          { permitted: { token: chain.token, amount: 149_999n } },
          "payment_invalid",
          /below the quoted maximum/
        ]
      ]
      for (const [bend, code, error] of cases) {
        const permit = yield* permitFor(account, bend)
        const rejection = yield* expectRejected(permit, code, verify(headerOf(permit)))
        assert.match(rejection.error, error)
      }
      const elsewhere = yield* permitFor(account)
      yield* expectRejected(elsewhere, "payment_invalid", verify(headerOf(elsewhere, "eip155:1")))
    })
  )

  it.effect("refuses a deadline outside 30 minutes to 2 hours (5 s of skew) and a validAfter to come", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const account = yield* demoAccount(0)
      yield* approvePermit2(account)
      const now = yield* nowSeconds
      const within = [now + 1800n - 4n, now + 7200n + 4n]
      for (const deadline of within) {
        const verified = yield* verify(headerOf(yield* permitFor(account, { deadline })))
        assert.strictEqual(verified.scheme, "upto")
      }
      for (const deadline of [now + 1800n - 10n, now + 7200n + 10n, now + 300n]) {
        const permit = yield* permitFor(account, { deadline })
        const rejection = yield* expectRejected(permit, "payment_invalid", verify(headerOf(permit)))
        assert.match(rejection.error, /deadline/)
      }
      const early = yield* permitFor(account, {
        witness: { to: chain.treasury, facilitator: chain.routerSigner, validAfter: now + 60n }
      })
      yield* expectRejected(early, "payment_invalid", verify(headerOf(early)))
    })
  )

  it.effect("refuses a signature that is not from `from`, or any field changed after signing", () =>
    Effect.gen(function* () {
      const account = yield* demoAccount(0)
      const other = yield* demoAccount(1)
      const permit = yield* permitFor(account)
      const forged = { ...(yield* permitFor(other)), from: account.address }
      const rejection = yield* expectRejected(forged, "payment_invalid", verify(headerOf(forged)))
      assert.match(rejection.error, /signature/)
      const raised = { ...permit, permitted: { ...permit.permitted, amount: 10_000_000n } }
      yield* expectRejected(raised, "payment_invalid", verify(headerOf(raised)))
    })
  )

  // A nonce used here is the reservation's to refuse (the primary key of `x402_authorizations`, D381).
  it.effect("refuses a nonce spent in Permit2's bitmap, a short balance, no allowance", () =>
    Effect.gen(function* () {
      const chain = yield* Chain
      const account = yield* demoAccount(0)
      yield* approvePermit2(account)

      // Spent on chain: the router settled it (zero moved; the nonce is gone all the same).
      const spent = yield* permitFor(account)
      const router = walletOf(chain, privateKeyToAccount(toHex(devAccount(0).getHdKey().privateKey!)))
      const hash = yield* Effect.promise(() => router.writeContract(uptoSettleCall(spent, 0n)))
      yield* Effect.promise(() => router.waitForTransactionReceipt({ hash }))
      assert.isTrue(yield* chain.permit2NonceUsed(account.address, spent.nonce))
      const rejection = yield* Effect.flip(verify(headerOf(spent)))
      assert.strictEqual(rejection.code, "payment_invalid")
      assert.strictEqual(rejection.error, "authorization already used")

      const pauper = privateKeyToAccount(generatePrivateKey())
      const broke = yield* permitFor(pauper)
      const poor = yield* expectRejected(broke, "payment_invalid", verify(headerOf(broke)))
      assert.strictEqual(poor.error, "insufficient balance")

      const unapproved = yield* permitFor(yield* demoAccount(2))
      const noAllowance = yield* expectRejected(unapproved, "payment_invalid", verify(headerOf(unapproved)))
      assert.match(noAllowance.error, /Permit2 allowance/)
    })
  )

  it.effect(
    "a failed Permit2 read is payment_verification_unavailable, retryable; the payment passes later",
    () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const account = yield* demoAccount(0)
        yield* approvePermit2(account)
        const rpcDown = Layer.succeed(Chain, {
          ...chain,
          permit2NonceUsed: () =>
            Effect.fail(new ChainError({ reason: "Timeout", message: "Chain.permit2NonceUsed: no answer" }))
        })
        const verifierWithoutRpc = Layer.fresh(PaymentVerifier.layer).pipe(
          Layer.provide(Layer.merge(rpcDown, Limits))
        )
        const permit = yield* permitFor(account)
        const rejection = yield* expectRejected(
          permit,
          "payment_verification_unavailable",
          verify(headerOf(permit)).pipe(Effect.provide(verifierWithoutRpc))
        )
        assert.isTrue(rejection.retryable)
        assert.strictEqual((yield* verify(headerOf(permit))).scheme, "upto")
      })
  )

  it.effect(
    "where only exact is taken (sessions, images, deposits), upto is wrong_scheme with exact accepts",
    () =>
      Effect.gen(function* () {
        const account = yield* demoAccount(0)
        const permit = yield* permitFor(account)
        const rejection = yield* expectRejected(
          permit,
          "wrong_scheme",
          verify(headerOf(permit), { upto: false })
        )
        assert.deepStrictEqual(
          rejection.accepts.map((a) => a.scheme),
          ["exact"]
        )
        const exactOnly = yield* Effect.flip(
          PaymentVerifier.use((verifier) =>
            verifier.verifyExact({
              header: headerOf(permit),
              worstCase: WORST_CASE,
              resourceUrl: RESOURCE,
              description: "deposit"
            })
          )
        )
        assert.strictEqual(exactOnly.code, "wrong_scheme")
      })
  )
})
