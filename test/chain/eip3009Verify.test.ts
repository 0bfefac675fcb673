import { assert, beforeAll, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Address, getAddress, type Hex, hashTypedData } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import {
  randomAuthorizationNonce,
  signTransferAuthorization,
  type TransferAuthorizationParams,
  transferAuthorizationDigest,
  transferWithAuthorizationTypes,
  verifyTransferAuthorization
} from "../../src/chain/Eip3009.ts"
import { keccakEngine, keccakReady } from "../../src/domain/Keccak.ts"

const payer = privateKeyToAccount("0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d")
const params = {
  token: "0x0000000000000000000000000000000000000a11" as const,
  chainId: 31337,
  domain: { name: "USD Coin", version: "2" },
  to: "0x0000000000000000000000000000000000000b0b" as const,
  value: 1_000_000n,
  validAfter: 0n,
  validBefore: 2_000_000_000n
}

describe("verifyTransferAuthorization", () => {
  it("accepts the payer's signature and nothing else: any field changed fails the check", async () => {
    const nonce = randomAuthorizationNonce()
    const signature = await signTransferAuthorization(payer, { ...params, nonce })
    const signed = { ...params, nonce, from: payer.address, signature }
    assert.isTrue(await verifyTransferAuthorization(signed))
    assert.isFalse(await verifyTransferAuthorization({ ...signed, value: 1_000_001n }))
    assert.isFalse(await verifyTransferAuthorization({ ...signed, to: payer.address }))
    assert.isFalse(
      await verifyTransferAuthorization({ ...signed, domain: { name: "USD Coin", version: "1" } })
    )
    assert.isFalse(await verifyTransferAuthorization({ ...signed, nonce: randomAuthorizationNonce() }))
    assert.isTrue(await verifyTransferAuthorization({ ...signed }))
  })

  it("answers a digest viem refuses with a rejected promise, not a throw", async () => {
    const nonce = randomAuthorizationNonce()
    const signature = await signTransferAuthorization(payer, { ...params, nonce })
    const answer = verifyTransferAuthorization({ ...params, nonce: "0x01", from: payer.address, signature })
    assert.instanceOf(answer, Promise)
    await answer.then(
      () => assert.fail("a one-byte nonce has no digest"),
      (error: unknown) => assert.instanceOf(error, Error)
    )
  })
})

const viemDigest = (from: Address, p: TransferAuthorizationParams) =>
  hashTypedData({
    domain: {
      name: p.domain.name,
      version: p.domain.version,
      chainId: p.chainId,
      verifyingContract: p.token
    },
    types: transferWithAuthorizationTypes,
    primaryType: "TransferWithAuthorization",
    message: {
      from,
      to: p.to,
      value: p.value,
      validAfter: p.validAfter,
      validBefore: p.validBefore,
      nonce: p.nonce
    }
  })

const bytesHex = (length: number) =>
  fc
    .uint8Array({ minLength: length, maxLength: length })
    .map((b) => `0x${Buffer.from(b).toString("hex")}` as Hex)
/** An address as a payer sends it: lower case or checksummed (others are viem's to refuse, below). */
const arbitraryAddress = bytesHex(20).chain((a) => fc.constantFrom(a as Address, getAddress(a)))
const uint256 = fc.bigInt({ min: 0n, max: 2n ** 256n - 1n })

describe("transferAuthorizationDigest", () => {
  beforeAll(() => keccakReady)

  it("is viem's hashTypedData over arbitrary authorizations, hashed with the WebAssembly keccak", () => {
    assert.strictEqual(keccakEngine(), "wasm")
    fc.assert(
      fc.property(
        arbitraryAddress,
        arbitraryAddress,
        arbitraryAddress,
        fc.integer({ min: 0, max: 2 ** 40 }),
        fc.record({ name: fc.string({ maxLength: 30 }), version: fc.string({ maxLength: 5 }) }),
        uint256,
        uint256,
        uint256,
        bytesHex(32),
        (from, to, token, chainId, domain, value, validAfter, validBefore, nonce) => {
          const p = { token, chainId, domain, to, value, validAfter, validBefore, nonce }
          assert.strictEqual(transferAuthorizationDigest(from, p), viemDigest(from, p))
        }
      ),
      { numRuns: 300 }
    )
  })

  it("is viem's hashTypedData of the authorization, or viem's own error, whatever the inputs", () => {
    const outcome = (f: () => Hex) => {
      try {
        return f()
      } catch (error) {
        return `threw ${(error as Error).name}`
      }
    }
    const nonce = randomAuthorizationNonce()
    const cases: ReadonlyArray<[Address, TransferAuthorizationParams]> = [
      [payer.address, { ...params, nonce }],
      [payer.address.toLowerCase() as Address, { ...params, nonce }],
      [
        getAddress(params.to),
        { ...params, token: getAddress(params.token), nonce: nonce.toUpperCase().replace("0X", "0x") as Hex }
      ],
      [payer.address, { ...params, nonce, value: 0n, validBefore: 2n ** 256n - 1n }],
      [payer.address, { ...params, nonce, chainId: 8453, domain: { name: "USDC", version: "2" } }],
      [payer.address, { ...params, nonce, token: "0x0000000000000000000000000000000000000A12" }],
      // viem refuses these: a failed checksum, a uint beyond 256 bits, a negative one, a short nonce.
      [payer.address.replace("C", "c") as Address, { ...params, nonce }],
      [payer.address, { ...params, nonce, value: 2n ** 256n }],
      [payer.address, { ...params, nonce, validAfter: -1n }],
      [payer.address, { ...params, nonce: "0x1234" }]
    ]
    for (const [from, p] of cases) {
      assert.strictEqual(
        outcome(() => transferAuthorizationDigest(from, p)),
        outcome(() => viemDigest(from, p)),
        `${from} ${p.value} ${p.nonce}`
      )
    }
  })
})
