import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as fc from "fast-check"
import { recoverMessageAddress, recoverTypedDataAddress } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { claimSigningString } from "../../src/integrity/Claims.ts"
import { canonicalJson, evidenceHash, evidenceText } from "../../src/integrity/Evidence.ts"
import { modelChallengeDigest, modelChallengeTypedData } from "../../src/integrity/ModelChallenge.ts"
import { rewardIntentDigest, rewardIntentTypedData } from "../../src/points/RewardIntent.ts"

/** The test vectors of docs/protocol.md section 7 (account 2 of the public Anvil test mnemonic). */
const account = privateKeyToAccount("0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a")

const evidence = {
  receipt_id: "req_0123456789abcdef",
  summary: "Replies match a smaller model",
  details: { probe: "identity", samples: 3, é: [1, 2.5, null, true], Z: "last?" }
}

/** Reorders every object's keys, deeply. */
const shuffled = (value: unknown, seed: number): unknown => {
  if (Array.isArray(value)) return value.map((v, i) => shuffled(v, seed + i))
  if (value === null || typeof value !== "object") return value
  const entries = Object.entries(value)
  const rotated = entries.map((_, i) => entries[(i + seed) % entries.length]!).reverse()
  return Object.fromEntries(rotated.map(([k, v]) => [k, shuffled(v, seed + 1)]))
}

describe("model-integrity and points wire vectors", () => {
  it("canonical JSON: sorted keys by UTF-16 units, no whitespace", () => {
    assert.strictEqual(
      evidenceText(evidence),
      '{"details":{"Z":"last?","probe":"identity","samples":3,"é":[1,2.5,null,true]},"receipt_id":"req_0123456789abcdef","summary":"Replies match a smaller model"}'
    )
    assert.strictEqual(
      evidenceHash(evidence),
      "0x7b8eae89ff596201807979508616daec5f9763fe46a9112c255b0626a80a842e"
    )
    assert.strictEqual(
      canonicalJson({ b: [{ d: 1, c: "\u2028" }], a: -0 }),
      '{"a":0,"b":[{"c":"\u2028","d":1}]}'
    )
  })

  it("canonical JSON is independent of key order and spacing, and parses back to the value", () => {
    fc.assert(
      fc.property(fc.jsonValue(), fc.nat(), (value, seed) => {
        const text = canonicalJson(value as never)
        return (
          text === canonicalJson(shuffled(value, seed) as never) &&
          text === canonicalJson(JSON.parse(JSON.stringify(value, null, 2))) &&
          canonicalJson(JSON.parse(text)) === text
        )
      })
    )
  })

  it.effect("ModelChallenge: digest and signature of the vector", () =>
    Effect.gen(function* () {
      const message = {
        wallet: account.address,
        receiptId: evidence.receipt_id,
        evidenceHash: evidenceHash(evidence)
      }
      assert.strictEqual(
        modelChallengeDigest(message),
        "0xae6742197b90cc7212a17b0f4750a0f73dc7dcf8bc4cfb510c2b88936f3215ea"
      )
      const signature = yield* Effect.promise(() => account.signTypedData(modelChallengeTypedData(message)))
      assert.strictEqual(
        signature,
        "0x2de3b61ac883b6f62f71feaa1c3ecd4b61d995cbc097a1dbc4a5b991170118396c94f2474fa1ee7366374023b879f87fe30fe79afb4c9ce4646c461fd0cf4a831b"
      )
      const recovered = yield* Effect.promise(() =>
        recoverTypedDataAddress({ ...modelChallengeTypedData(message), signature })
      )
      assert.strictEqual(recovered, account.address)
    })
  )

  it.effect("PointsReward: digest and signature of the vector", () =>
    Effect.gen(function* () {
      const intent = {
        reward: "follow" as const,
        wallet: account.address,
        nonce: `0x${"ab".repeat(32)}` as const,
        issuedAt: 1767225600
      }
      assert.strictEqual(
        rewardIntentDigest(intent),
        "0x62199ddf396b35b6a8f4756807ddbdfe52c36fa56c4c668bbb97e53990c41a8f"
      )
      const signature = yield* Effect.promise(() => account.signTypedData(rewardIntentTypedData(intent)))
      assert.strictEqual(
        signature,
        "0xf8448d0ab36405bd45be1a7911f1deb687767ac78b7fdbd6d47e6a4f3afd6bd53c25743f525c3a287572351f2ccbdb110de085b5e22ef08734a10822bf80b1721b"
      )
      // The same intent for the other reward is another message: a follow signature pays no demo share.
      assert.notStrictEqual(
        rewardIntentDigest({ ...intent, reward: "demo_share" }),
        rewardIntentDigest(intent)
      )
    })
  )

  it.effect("provider claim: the EIP-191 string and signature of the vector", () =>
    Effect.gen(function* () {
      const claim = {
        provider_id: "sim-openai-1",
        model_class: "chat-medium",
        model: "meta-llama/Llama-3.1-70B-Instruct",
        bond_amount: 250_000_000,
        signed_at: 1767225600
      }
      const message = claimSigningString(claim)
      assert.strictEqual(
        message,
        "svc model-integrity claim\nprovider_id: sim-openai-1\nmodel_class: chat-medium\nmodel: meta-llama/Llama-3.1-70B-Instruct\nbond_amount: 250000000\nsigned_at: 1767225600"
      )
      const signature = yield* Effect.promise(() => account.signMessage({ message }))
      assert.strictEqual(
        signature,
        "0x32da21d55e4cc5de82e33da59cb5489811ce7cbc55cbf8537c05ba1c6b66bc925daa1476e04582bb28e660696b1510a9914f09a6b1d4045b4ce498198ef6a1be1c"
      )
      assert.strictEqual(
        yield* Effect.promise(() => recoverMessageAddress({ message, signature })),
        account.address
      )
    })
  )
})
