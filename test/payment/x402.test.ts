import { assert, describe, it } from "@effect/vitest"
import { x402Client, x402HTTPClient } from "@x402/core/client"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { ConfigProvider, Effect, Result } from "effect"
import fc from "fast-check"
import { type Address, getAddress, type Hex } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { randomAuthorizationNonce, signTransferAuthorization } from "../../src/chain/Eip3009.ts"
import { decodeX402Header, paymentRequiredHeader, paymentResponseHeader } from "../../src/domain/X402.ts"
import {
  decodePaymentSignature,
  type ExactPayment,
  paymentRequired,
  quoteAmount,
  X402Config,
  type X402Settings
} from "../../src/payment/X402.ts"

// A throwaway key: nothing here touches a chain.
const payer = privateKeyToAccount("0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")

const settings: X402Settings = {
  network: "eip155:31337",
  asset: "0x5FbDB2315678afecb367f032d93F642f64180aa3",
  payTo: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
  tokenDomain: { name: "USD Coin", version: "2" },
  maxTimeoutSeconds: 300,
  facilitator: "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
  uptoProxy: "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002",
  uptoTimeoutSeconds: 3600,
  soloSettleFloor: 10_000,
  paymentCap: 50_000_000
}

const base64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString("base64")

const quote = (worstCase: number, extra: Partial<Parameters<typeof paymentRequired>[0]> = {}) =>
  paymentRequired({
    settings,
    worstCase,
    resourceUrl: "http://router.test/v1/chat/completions",
    description: "chat completion",
    error: "payment required",
    ...extra
  })

/** The official v2 client's answer to our 402, as it would put it in `PAYMENT-SIGNATURE`. */
const officialPaymentHeader = (worstCase: number) =>
  Effect.promise(() => {
    const client = new x402Client()
      .register("eip155:31337", new ExactEvmScheme(payer))
      .setSpendControls({ allowedAssets: [{ network: "eip155:31337", asset: settings.asset }] })
    const http = new x402HTTPClient(client)
    const header = paymentRequiredHeader(quote(worstCase))
    const required = http.getPaymentRequiredResponse((name) =>
      name.toLowerCase() === "payment-required" ? header : null
    )
    return http
      .createPaymentPayload(required)
      .then((payload) => http.encodePaymentSignatureHeader(payload)["PAYMENT-SIGNATURE"]!)
  })

const signedPayload = Effect.gen(function* () {
  const params = {
    token: settings.asset,
    chainId: 31337,
    domain: settings.tokenDomain,
    to: settings.payTo,
    value: 250_000n,
    validAfter: 0n,
    validBefore: 1_900_000_000n,
    nonce: randomAuthorizationNonce()
  }
  const signature = yield* Effect.promise(() => signTransferAuthorization(payer, params))
  return {
    authorization: {
      from: payer.address,
      to: params.to,
      value: "250000",
      validAfter: "0",
      validBefore: "1900000000",
      nonce: params.nonce
    },
    signature
  }
})

const decodeOk = (header: string): ExactPayment => {
  const result = decodePaymentSignature(header)
  if (Result.isFailure(result)) assert.fail(`expected a payment, got: ${result.failure.message}`)
  if (result.success.scheme !== "exact") assert.fail("expected an exact payment")
  return result.success
}

const decodeErr = (header: string, schemes?: ReadonlyArray<"exact" | "upto">) => {
  const result = decodePaymentSignature(header, schemes)
  if (Result.isSuccess(result)) assert.fail("expected the envelope to be rejected")
  return result.failure
}

describe("decodePaymentSignature", () => {
  it.effect("reads the official v2 envelope and the spec's flat one as the same payment", () =>
    Effect.gen(function* () {
      const official = yield* officialPaymentHeader(250_000)
      const nested = decodeX402Header(official) as {
        accepted: { network: string; asset: string; payTo: string }
        payload: unknown
      }
      assert.containsAllKeys(nested, ["x402Version", "accepted", "payload"])
      // The flat envelope may name the asset and recipient too; both shapes carry them to the verifier.
      const flat = base64({
        x402Version: 2,
        scheme: "exact",
        network: "eip155:31337",
        asset: nested.accepted.asset,
        payTo: nested.accepted.payTo,
        payload: nested.payload
      })

      const fromOfficial = decodeOk(official)
      assert.deepStrictEqual(decodeOk(flat), fromOfficial)
      assert.strictEqual(fromOfficial.scheme, "exact")
      assert.strictEqual(fromOfficial.network, "eip155:31337")
      assert.strictEqual(fromOfficial.asset, settings.asset)
      assert.strictEqual(fromOfficial.payTo, settings.payTo)
      assert.strictEqual(fromOfficial.authorization.from, payer.address)
      assert.strictEqual(fromOfficial.authorization.to, settings.payTo)
      assert.strictEqual(fromOfficial.authorization.value, 250_000n)
      assert.strictEqual(fromOfficial.authorization.validAfter, 0n)
      assert.isTrue(fromOfficial.authorization.validBefore > 0n)
      assert.match(fromOfficial.authorization.nonce, /^0x[0-9a-f]{64}$/)
      assert.match(fromOfficial.signature, /^0x[0-9a-f]{130}$/)
    })
  )

  it.effect("accepts JSON numbers, lowercase addresses and url-safe base64 defensively", () =>
    Effect.gen(function* () {
      const { authorization, signature } = yield* signedPayload
      const canonical = decodeOk(
        base64({
          x402Version: 2,
          scheme: "exact",
          network: "eip155:31337",
          payload: { authorization, signature }
        })
      )
      const loose = {
        x402Version: 2,
        scheme: "exact",
        network: "eip155:31337",
        payload: {
          authorization: {
            ...authorization,
            from: authorization.from.toLowerCase(),
            value: 250_000,
            validAfter: 0,
            validBefore: 1_900_000_000
          },
          signature
        }
      }
      assert.deepStrictEqual(decodeOk(base64(loose)), canonical)
      const urlSafe = Buffer.from(JSON.stringify(loose)).toString("base64url")
      assert.deepStrictEqual(decodeOk(urlSafe), canonical)
      assert.strictEqual(canonical.authorization.from, getAddress(payer.address))
    })
  )

  it("round-trips any well-formed authorization in both shapes", () =>
    fc.assert(
      fc.property(
        fc.record({
          from: fc.uint8Array({ minLength: 20, maxLength: 20 }),
          to: fc.uint8Array({ minLength: 20, maxLength: 20 }),
          value: fc.bigInt({ min: 0n, max: 2n ** 256n - 1n }),
          validAfter: fc.bigInt({ min: 0n, max: 2n ** 64n }),
          validBefore: fc.bigInt({ min: 0n, max: 2n ** 64n }),
          nonce: fc.uint8Array({ minLength: 32, maxLength: 32 }),
          signature: fc.uint8Array({ minLength: 1, maxLength: 200 })
        }),
        (a) => {
          const hex = (bytes: Uint8Array) => `0x${Buffer.from(bytes).toString("hex")}` as Hex
          const authorization = {
            from: hex(a.from),
            to: hex(a.to),
            value: a.value.toString(),
            validAfter: a.validAfter.toString(),
            validBefore: a.validBefore.toString(),
            nonce: hex(a.nonce)
          }
          const payload = { authorization, signature: hex(a.signature) }
          const accepted = { scheme: "exact", network: "eip155:8453", amount: "1", asset: settings.asset }
          const nested = decodeOk(base64({ x402Version: 2, accepted, payload }))
          const flat = decodeOk(
            base64({
              x402Version: 2,
              scheme: "exact",
              network: "eip155:8453",
              asset: settings.asset,
              payload
            })
          )
          assert.deepStrictEqual(nested, flat)
          assert.deepStrictEqual(nested.authorization, {
            from: getAddress(authorization.from),
            to: getAddress(authorization.to),
            value: a.value,
            validAfter: a.validAfter,
            validBefore: a.validBefore,
            nonce: authorization.nonce
          })
        }
      )
    ))

  it.effect("rejects garbage, bad base64, wrong versions, missing fields and wrong types", () =>
    Effect.gen(function* () {
      const { authorization, signature } = yield* signedPayload
      const flat = (overrides: Record<string, unknown> = {}, auth: Record<string, unknown> = {}) =>
        base64({
          x402Version: 2,
          scheme: "exact",
          network: "eip155:31337",
          payload: { authorization: { ...authorization, ...auth }, signature },
          ...overrides
        })
      const malformed = (header: string, mentions?: string) => {
        const error = decodeErr(header)
        assert.strictEqual(error.reason, "malformed", error.message)
        if (mentions !== undefined) assert.include(error.message, mentions)
        assert.notInclude(error.message, signature.slice(2, 40), "never echoes the signature")
        assert.notInclude(error.message, authorization.nonce.slice(2, 40), "never echoes the envelope")
        return error
      }

      malformed("", "empty")
      malformed("%%% not base64 %%%", "not base64")
      malformed(Buffer.from("{not json").toString("base64"), "not base64 JSON")
      malformed(base64([1, 2, 3]), "not a JSON object")
      malformed(base64("a string"), "not a JSON object")
      malformed("A".repeat(20_000), "too large")

      assert.strictEqual(decodeErr(flat({ x402Version: 1 })).reason, "unsupported_version")
      assert.strictEqual(decodeErr(flat({ x402Version: "2" })).reason, "unsupported_version")
      assert.strictEqual(decodeErr(flat({ x402Version: undefined })).reason, "unsupported_version")

      malformed(flat({ scheme: undefined }), "scheme")
      malformed(flat({ network: 31337 }), "network")
      malformed(flat({ payload: undefined }), "payload")
      malformed(flat({ payload: { authorization } }), "payload.signature")
      malformed(flat({}, { nonce: undefined }), "payload.authorization.nonce")
      malformed(flat({}, { nonce: "0x1234" }), "payload.authorization.nonce")
      malformed(flat({}, { from: "0x1234" }), "payload.authorization.from")
      malformed(flat({}, { to: 42 }), "payload.authorization.to")
      malformed(flat({}, { value: "-1" }), "payload.authorization.value")
      malformed(flat({}, { value: "1.5" }), "payload.authorization.value")
      malformed(flat({}, { value: 1.5 }), "payload.authorization.value")
      malformed(flat({}, { value: 2 ** 60 }), "payload.authorization.value")
      malformed(flat({}, { value: (2n ** 256n).toString() }), "payload.authorization.value")
      malformed(flat({}, { validBefore: true }), "payload.authorization.validBefore")
      malformed(flat({ payload: { authorization, signature: "0xabc" } }), "payload.signature")
      malformed(flat({ payload: { authorization, signature: "zz" } }), "payload.signature")
      malformed(
        base64({ x402Version: 2, accepted: { scheme: "exact" }, payload: { authorization, signature } })
      )
    })
  )

  it.effect(
    "reports a scheme the surface does not take as such, even when its payload has another shape",
    () =>
      Effect.gen(function* () {
        const { authorization, signature } = yield* signedPayload
        const nested = base64({
          x402Version: 2,
          accepted: { scheme: "upto", network: "eip155:31337", amount: "1000" },
          payload: { signature, permit2Authorization: { from: authorization.from } }
        })
        const upto = decodeErr(nested, ["exact"])
        assert.strictEqual(upto.reason, "unsupported_scheme")
        assert.include(upto.message, "upto")
        const flat = decodeErr(
          base64({
            x402Version: 2,
            scheme: "upto",
            network: "eip155:31337",
            payload: { authorization, signature }
          }),
          ["exact"]
        )
        assert.strictEqual(flat.reason, "unsupported_scheme")
        // Where upto is taken, its payload must be well-formed; a scheme nobody takes is unsupported.
        assert.strictEqual(decodeErr(nested).reason, "malformed")
        const deferred = decodeErr(
          base64({
            x402Version: 2,
            scheme: "deferred",
            network: "eip155:31337",
            payload: { authorization, signature }
          })
        )
        assert.strictEqual(deferred.reason, "unsupported_scheme")
      })
  )

  it("reads the official upto payload: a Permit2 witness transfer with decimal numbers", () => {
    const permit2Authorization = {
      from: "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc",
      permitted: { token: "0x5FbDB2315678afecb367f032d93F642f64180aa3", amount: "5000000" },
      spender: "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002",
      nonce: "77648812782670860460512307594061302913369283834606025297048026922953510464427",
      deadline: "1767229200",
      witness: {
        to: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
        facilitator: "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
        validAfter: "0"
      }
    }
    const signature = `0x${"ab".repeat(65)}`
    const result = decodePaymentSignature(
      base64({
        x402Version: 2,
        accepted: { scheme: "upto", network: "eip155:31337", amount: "5000000" },
        payload: { signature, permit2Authorization }
      })
    )
    if (Result.isFailure(result)) assert.fail(result.failure.message)
    const payment = result.success
    if (payment.scheme !== "upto") assert.fail("expected an upto payment")
    assert.strictEqual(payment.authorization.from, "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC")
    assert.strictEqual(payment.authorization.permitted.amount, 5_000_000n)
    assert.strictEqual(payment.authorization.nonce, BigInt(permit2Authorization.nonce))
    assert.strictEqual(payment.authorization.deadline, 1_767_229_200n)
    assert.strictEqual(payment.authorization.witness.validAfter, 0n)
    assert.strictEqual(payment.signature, signature)
  })
})

describe("paymentRequired", () => {
  it("carries every field of spec 2.7 and the x402 v2 requirement", () => {
    const required = quote(123_456)
    assert.strictEqual(required._tag, "PaymentRequired")
    assert.strictEqual(required.x402Version, 2)
    assert.strictEqual(required.error, "payment required")
    assert.strictEqual(required.code, "payment_required")
    assert.isString(required.hint)
    assert.deepStrictEqual(required.resource, {
      url: "http://router.test/v1/chat/completions",
      description: "chat completion",
      mimeType: "application/json"
    })
    assert.deepStrictEqual(required.accepts, [
      {
        scheme: "exact",
        network: "eip155:31337",
        maxAmountRequired: "123456",
        amount: "123456",
        payTo: settings.payTo,
        asset: settings.asset,
        maxTimeoutSeconds: 300,
        extra: { name: "USD Coin", version: "2" }
      }
    ])
    assert.strictEqual(required.credits.header, "x-credit-key")
    assert.strictEqual(required.credits.required, "123456")
    assert.strictEqual(required.credits.unit, "base units of USDC (6 decimals)")
    assert.match(required.credits.note, /^[^.]+\.$/)
    assert.isUndefined(required.session_required)
    assert.isUndefined(required.floor)
    assert.isUndefined(required.retryable)
  })

  it("quotes the solo settlement floor for a small worst case, while credits ask only the worst case", () => {
    const small = quote(1_234)
    assert.strictEqual(small.accepts[0]!.amount, "10000")
    assert.strictEqual(small.accepts[0]!.maxAmountRequired, "10000")
    assert.strictEqual(small.credits.required, "1234")
  })

  it("answers a worst case above the cap with payment_limit, still quoting accepts", () => {
    const limit = quote(50_000_001, { code: "payment_invalid", error: "ignored" })
    assert.strictEqual(limit.code, "payment_limit")
    assert.include(limit.error, "50000000")
    assert.include(limit.hint ?? "", "max_tokens")
    assert.strictEqual(limit.accepts[0]!.amount, "50000001")
    assert.strictEqual(quote(50_000_000).code, "payment_required")
  })

  it("marks solo_settle_floor with session_required and the floor", () => {
    const floor = quote(5_000, { code: "solo_settle_floor", error: "below the floor" })
    assert.strictEqual(floor.code, "solo_settle_floor")
    assert.isTrue(floor.session_required)
    assert.strictEqual(floor.floor, "10000")
    assert.include(floor.hint ?? "", "session")
    const unavailable = quote(5_000, {
      code: "payment_verification_unavailable",
      error: "x",
      retryable: true
    })
    assert.isTrue(unavailable.retryable)
    assert.isUndefined(unavailable.session_required)
  })

  it("travels in PAYMENT-REQUIRED as the official client reads it", () => {
    const required = quote(777_000)
    const header = paymentRequiredHeader(required)
    assert.deepStrictEqual(decodeX402Header(header), {
      x402Version: 2,
      error: "payment required",
      resource: required.resource,
      accepts: [
        {
          scheme: "exact",
          network: "eip155:31337",
          maxAmountRequired: "777000",
          amount: "777000",
          payTo: settings.payTo,
          asset: settings.asset,
          maxTimeoutSeconds: 300,
          extra: { name: "USD Coin", version: "2" }
        }
      ]
    })
    const official = new x402HTTPClient(new x402Client()).getPaymentRequiredResponse((name) =>
      name === "PAYMENT-REQUIRED" ? header : null
    )
    assert.strictEqual(official.x402Version, 2)
    assert.strictEqual(official.accepts[0]!.amount, "777000")
    assert.deepStrictEqual(official.resource, required.resource)
  })

  it("quoteAmount covers the worst case and the floor, and is one of them", () =>
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
        fc.integer({ min: 0, max: 10_000_000 }),
        (worstCase, soloSettleFloor) => {
          const amount = quoteAmount(worstCase, { soloSettleFloor })
          assert.isTrue(Number.isSafeInteger(amount))
          assert.isTrue(amount >= worstCase && amount >= soloSettleFloor)
          assert.isTrue(amount === worstCase || amount === soloSettleFloor)
        }
      )
    ))
})

describe("paymentResponseHeader", () => {
  it("is base64 JSON the official client reads as a settle response", () => {
    const tx: Hex = `0x${"ab".repeat(32)}`
    const payerAddress: Address = payer.address
    const header = paymentResponseHeader({
      success: true,
      transaction: tx,
      network: "eip155:31337",
      payer: payerAddress,
      amount: 4_321n
    })
    const expected = {
      success: true,
      transaction: tx,
      network: "eip155:31337",
      payer: payerAddress,
      amount: "4321"
    }
    assert.deepStrictEqual(decodeX402Header(header), expected)
    const official = new x402HTTPClient(new x402Client()).getPaymentSettleResponse((name) =>
      name === "PAYMENT-RESPONSE" ? header : null
    )
    assert.deepStrictEqual<object>({ ...official }, expected)
  })
})

describe("X402Config", () => {
  const limits = (env: Record<string, string>) =>
    X402Config.useSync((config) => ({ ...config })).pipe(
      Effect.provide(X402Config.layer),
      Effect.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord(env)))
    )

  it.effect("defaults to a 0.01 USDC floor, a 50 USDC cap and the 300 s launch timeout", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* limits({}), {
        soloSettleFloor: 10_000,
        paymentCap: 50_000_000,
        maxTimeoutSeconds: 300,
        uptoTimeoutSeconds: 3600
      })
      assert.deepStrictEqual(
        yield* limits({
          SOLO_SETTLE_FLOOR: "2500",
          PAYMENT_CAP: "1000000",
          PAYMENT_TIMEOUT_SECONDS: "600",
          UPTO_TIMEOUT_SECONDS: "1800"
        }),
        { soloSettleFloor: 2_500, paymentCap: 1_000_000, maxTimeoutSeconds: 600, uptoTimeoutSeconds: 1800 }
      )
    })
  )

  it.effect("refuses a negative floor and a timeout the exact or the upto window cannot hold", () =>
    Effect.gen(function* () {
      const invalid: ReadonlyArray<Record<string, string>> = [
        { SOLO_SETTLE_FLOOR: "-1" },
        { PAYMENT_CAP: "1.5" },
        { PAYMENT_TIMEOUT_SECONDS: "60" },
        { PAYMENT_TIMEOUT_SECONDS: String(8 * 24 * 3600) },
        { UPTO_TIMEOUT_SECONDS: "1799" },
        { UPTO_TIMEOUT_SECONDS: "7201" }
      ]
      for (const env of invalid) {
        const exit = yield* Effect.exit(limits(env))
        assert.isTrue(exit._tag === "Failure", JSON.stringify(env))
      }
    })
  )
})
