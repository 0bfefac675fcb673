import { assert, describe, it } from "@effect/vitest"
import {
  uptoPermit2WitnessTypes,
  PERMIT2_ADDRESS as X402_PERMIT2_ADDRESS,
  x402UptoPermit2ProxyAddress
} from "@x402/evm"
import { Effect } from "effect"
import fc from "fast-check"
import { domainSeparator, type Hex, hashTypedData, keccak256, numberToHex, toHex } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import {
  PERMIT2_ADDRESS,
  permit2DomainSeparator,
  permit2RuntimeCode,
  UPTO_PROXY_ADDRESS,
  UPTO_WITNESS_TYPEHASH
} from "../../src/chain/Permit2.ts"
import { permit2Immutables, permit2RuntimeBytecode } from "../../src/chain/permit2Artifact.ts"
import {
  nonceBitmapPosition,
  recoverUptoPermitSigner,
  signUptoPermit,
  uptoPermitTypedData,
  uptoPermitTypes
} from "../../src/chain/UptoPermit.ts"

const bytesAt = (code: Hex, start: number, length: number) =>
  code.slice(2 + start * 2, 2 + (start + length) * 2)

describe("Permit2 and the upto proxy (pure)", () => {
  it("uses the addresses and the witness types of the official x402 package", () => {
    assert.strictEqual(PERMIT2_ADDRESS, X402_PERMIT2_ADDRESS)
    assert.strictEqual(UPTO_PROXY_ADDRESS, x402UptoPermit2ProxyAddress)
    assert.deepStrictEqual(uptoPermitTypes, uptoPermit2WitnessTypes)
    assert.strictEqual(
      UPTO_WITNESS_TYPEHASH,
      keccak256(toHex("Witness(address to,address facilitator,uint256 validAfter)"))
    )
  })

  it("computes Permit2's domain separator as EIP-712 does (name only, no version)", () => {
    assert.strictEqual(
      permit2DomainSeparator(1),
      // The separator of the canonical Permit2 on Ethereum mainnet, as it answers DOMAIN_SEPARATOR().
      "0x866a5aba21966af95d6c7ab78eb2b2fc913915c28be3b9aa07cc04ff903e3f28"
    )
  })

  it("fills exactly the two immutables with the chain id and the canonical domain separator", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 48 }), (chainId) => {
        const code = permit2RuntimeCode(chainId)
        assert.strictEqual(code.length, permit2RuntimeBytecode.length)
        const [chainIdAt] = permit2Immutables._CACHED_CHAIN_ID
        const [separatorAt] = permit2Immutables._CACHED_DOMAIN_SEPARATOR
        assert.strictEqual(`0x${bytesAt(code, chainIdAt.start, 32)}`, numberToHex(chainId, { size: 32 }))
        assert.strictEqual(
          `0x${bytesAt(code, separatorAt.start, 32)}`,
          domainSeparator({ domain: { name: "Permit2", chainId, verifyingContract: PERMIT2_ADDRESS } })
        )
        // every other byte is the compiler's
        const outside = (c: Hex) =>
          [
            [0, chainIdAt.start],
            [chainIdAt.start + 32, separatorAt.start],
            [separatorAt.start + 32, (c.length - 2) / 2]
          ].map(([from, to]) => bytesAt(c, from!, to! - from!))
        assert.deepStrictEqual(outside(code), outside(permit2RuntimeBytecode))
      }),
      { numRuns: 25 }
    )
  })

  it("locates a nonce's bit in Permit2's bitmap as word nonce >> 8, bit nonce & 255", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 2n ** 256n - 1n }), (nonce) => {
        const { wordPos, bitPos } = nonceBitmapPosition(nonce)
        assert.isTrue(bitPos >= 0n && bitPos < 256n)
        assert.strictEqual(wordPos * 256n + bitPos, nonce)
      })
    )
  })

  it.effect("reproduces the upto test vector of docs/protocol.md section 6", () =>
    Effect.gen(function* () {
      const account = privateKeyToAccount(
        "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"
      )
      const fields = {
        from: account.address,
        permitted: { token: "0x5FbDB2315678afecb367f032d93F642f64180aa3", amount: 5_000_000n },
        spender: "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002",
        nonce: 77648812782670860460512307594061302913369283834606025297048026922953510464427n,
        deadline: 1767229200n,
        witness: {
          to: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
          facilitator: "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
          validAfter: 0n
        }
      } as const
      assert.strictEqual(fields.nonce, BigInt(`0x${"ab".repeat(32)}`))
      const digest = "0xcc14e511f8ec9433b5892a7964a20c0925adc816a773971e0c64d96539a7bfae"
      const signature =
        "0xb20a50f85fa9f8e58fa413eef3954ec10b4eb8c8fbf1de7594fb94c81a0ea0b03a00bd22639984df0aa93740ac505f9b81c011e1d48909ae8592f484ed5924ad1b"
      // the digest as the official package's types and domain give it
      assert.strictEqual(
        hashTypedData({
          domain: { name: "Permit2", chainId: 31337, verifyingContract: X402_PERMIT2_ADDRESS },
          types: uptoPermit2WitnessTypes,
          primaryType: "PermitWitnessTransferFrom",
          message: fields
        }),
        digest
      )
      assert.strictEqual(hashTypedData(uptoPermitTypedData(31337, fields)), digest)
      assert.strictEqual(yield* Effect.promise(() => signUptoPermit(account, 31337, fields)), signature)
      assert.strictEqual(yield* recoverUptoPermitSigner(31337, { ...fields, signature }), account.address)
      // the hashes the section lists
      assert.strictEqual(
        keccak256(
          toHex(
            "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline," +
              "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)"
          )
        ),
        "0x51dff6974ad4388c499e7fcfe838d2bd767162553a144098ce20ea661d70c2ee"
      )
      assert.strictEqual(
        UPTO_WITNESS_TYPEHASH,
        "0xd4171c445a74218b01d4fd8af34ff1106580ea1e36ff837e64484bfaa2253b75"
      )
      assert.strictEqual(
        keccak256(toHex("TokenPermissions(address token,uint256 amount)")),
        "0x618358ac3db8dc274f0cd8829da7e234bd48cd73c4a740aede1adec9846d06a1"
      )
      assert.strictEqual(
        permit2DomainSeparator(31337),
        "0x4d553c58ae79a6c4ba64f0e690a5d1cd2deff8c6b91cf38300e0f2b76f9ee346"
      )
    })
  )
})
