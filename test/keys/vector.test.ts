import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import * as fc from "fast-check"
import { hashTypedData, recoverTypedDataAddress } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { withdrawalDomain, withdrawalTypes } from "../../src/domain/Credits.ts"
import { formatUsdc, parseUsdc } from "../../src/payment/Keys.ts"
import { checkKeysSignature, keysMessage } from "../../src/payment/KeysAuth.ts"

// docs/protocol.md section 4: the keys-request test vector.
const account = privateKeyToAccount("0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a")
const timestamp = "1767225600"
const body = '{"label":"ci-agent","budget_usdc":"5.00","spend":true}'
const expectedMessage =
  "svc keys request\nmethod: POST\npath: /v1/keys\ntimestamp: 1767225600\n" +
  "body-sha256: 2fa646698cf6d339b09c32956035e97f88d127c86fb509e3038dca9802e75545"
const expectedSignature =
  "0xbca0fe532759a721a0cc1f025a429cbbc5c833231914d78e730ee043478f41477da42ff1d9db0073cde1169ccbebcef9470e1a8b1e1e664abcab0f29b05638021b"
const emptyBodyMessage =
  "svc keys request\nmethod: GET\npath: /v1/keys\ntimestamp: 1767225600\n" +
  "body-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
const emptyBodySignature =
  "0x78c6efb3f676e2677ebb36793fc19dbf4343e5353ad695199802d7682cb1a9d53d0b3b2023a43c8587c16452a650b927fa20c8809004242f6b1c1bb250aed4191c"

const request = (overrides: Partial<Parameters<typeof checkKeysSignature>[0]> = {}) => ({
  method: "POST",
  path: "/v1/keys",
  timestamp,
  body,
  wallet: "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
  signature: expectedSignature,
  ...overrides
})

describe("keys request signature (test vector)", () => {
  it.effect("the message and signature match docs/protocol.md", () =>
    Effect.gen(function* () {
      assert.strictEqual(account.address, "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC")
      const message = keysMessage({ method: "post", path: "/v1/keys", timestamp, body })
      assert.strictEqual(message, expectedMessage)
      assert.strictEqual(yield* Effect.promise(() => account.signMessage({ message })), expectedSignature)
      const empty = keysMessage({ method: "GET", path: "/v1/keys", timestamp, body: "" })
      assert.strictEqual(empty, emptyBodyMessage)
      assert.strictEqual(
        yield* Effect.promise(() => account.signMessage({ message: empty })),
        emptyBodySignature
      )
    })
  )

  it.effect("accepted within 300 s either side, with the wallet in any letter case", () =>
    Effect.gen(function* () {
      const now = Number(timestamp)
      for (const at of [now, now - 300, now + 300]) {
        const accepted = yield* checkKeysSignature(request(), at)
        assert.strictEqual(accepted.wallet, "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc")
        assert.strictEqual(accepted.expiresAt, now + 300)
      }
      const lower = yield* checkKeysSignature(request({ wallet: request().wallet.toLowerCase() }), now)
      assert.strictEqual(lower.wallet, "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc")
    })
  )

  it.effect("refused: 301 s old or ahead, tampered body, path, method, another wallet, junk headers", () =>
    Effect.gen(function* () {
      const now = Number(timestamp)
      const refusals = [
        [request(), now + 301],
        [request(), now - 301],
        [request({ body: body.replace("5.00", "500.00") }), now],
        [request({ path: "/v1/keys/usage" }), now],
        [request({ method: "DELETE" }), now],
        [request({ timestamp: "1767225601" }), now],
        [request({ wallet: "0x90F79bf6EB2c4f870365E785982E1f101E93b906" }), now],
        [request({ wallet: undefined }), now],
        [request({ signature: undefined }), now],
        [request({ signature: "0x1234" }), now],
        [request({ timestamp: "1767225600.5" }), now]
      ] as const
      for (const [input, at] of refusals) {
        const exit = yield* Effect.exit(checkKeysSignature(input, at))
        assert.isTrue(Exit.isFailure(exit), JSON.stringify(input))
        if (Exit.isFailure(exit)) {
          const error = exit.cause.reasons[0]
          assert.include(JSON.stringify(error), "invalid_wallet_signature")
        }
      }
    })
  )
})

describe("credit withdrawal typed data (test vector)", () => {
  it.effect("digest and signature match docs/protocol.md", () =>
    Effect.gen(function* () {
      const typedData = {
        domain: withdrawalDomain(31337),
        types: withdrawalTypes,
        primaryType: "CreditWithdrawal" as const,
        message: {
          wallet: account.address,
          to: "0x90F79bf6EB2c4f870365E785982E1f101E93b906",
          amount: 1_500_000n,
          nonce: `0x${"ab".repeat(32)}`,
          deadline: 1_767_229_200n
        }
      } as const
      assert.strictEqual(
        hashTypedData(typedData),
        "0x7fe2b3af12e8fcafd22e16fc86f293080305815ae2cc760c8784d14bf25a0a5a"
      )
      const signature = yield* Effect.promise(() => account.signTypedData(typedData))
      assert.strictEqual(
        signature,
        "0x943aebe4a06790ddcfc2f8f85a7a284d375f66a396c864aa49983409e82827523771d3514e21aaf0b42b86f3a9ef457b7a455c1045b5f9e7eb4e58ec811d07ed1c"
      )
      const recovered = yield* Effect.promise(() => recoverTypedDataAddress({ ...typedData, signature }))
      assert.strictEqual(recovered, account.address)
    })
  )
})

describe("USDC amounts", () => {
  it("parses exact decimals into base units and formats them back", () => {
    assert.strictEqual(parseUsdc("5"), 5_000_000)
    assert.strictEqual(parseUsdc("5.00"), 5_000_000)
    assert.strictEqual(parseUsdc("0.000001"), 1)
    assert.strictEqual(parseUsdc("123.4567"), 123_456_700)
    for (const bad of ["", "1.", ".5", "1.0000001", "-1", "1e3", "0x10", " 1", "1,5", "1234567890"]) {
      assert.isUndefined(parseUsdc(bad), bad)
    }
    assert.strictEqual(formatUsdc(1_500_000), "1.500000")
    assert.strictEqual(formatUsdc(1), "0.000001")
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 999_999_999_999_999 }), (base) => {
        assert.strictEqual(parseUsdc(formatUsdc(base)), base)
      })
    )
  })
})
