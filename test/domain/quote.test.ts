import { recoverMessageAddress } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { describe, expect, it } from "vitest"
import { quoteSigningString } from "../../src/domain/Quote.ts"

// The vector published in docs/protocol.md section 1.
const key = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"
const base = {
  quote_id: "q-0001",
  provider_id: "prov-a",
  model_class: "chat-medium",
  price_in: 800000,
  price_out: 3200000,
  max_context: 131072,
  valid_until: 1767225600,
  capacity_rps: 8
} as const
const vectors = [
  {
    quote: base,
    text: "q-0001|prov-a|chat-medium|800000|3200000|131072|1767225600|8",
    sig: "0x3942c5f083ca3709a4d098353bec6b9ac42c68aa41de9bd848ecb528c0f698273b7b5c2a3762a97dd8606e656f933eab721998edf47f1405b240d9b2956ab39a1b"
  },
  {
    quote: { ...base, price_in_cached: 200000, session_ttl_s: 600 },
    text: "q-0001|prov-a|chat-medium|800000|3200000|131072|1767225600|8|200000|600",
    sig: "0x253204e6752b6bed41b08154f1402b6c12f0b81056f49c538947f089129bfedb67d12b66ddd84b3ac19a5d981b4b00dfead7ab83cdf98a0fd29a44b7ee6493bd1b"
  },
  {
    quote: { ...base, context_protocol: "passport-v1", speculative: false },
    text: "q-0001|prov-a|chat-medium|800000|3200000|131072|1767225600|8|context-v1|passport-v1|||false|",
    sig: "0xb20a2b439448ea7b4d4a6a98c02b3c6e8814ba99634150cbf41a453c9f2328cf0a4d350a371ab4a85e373d450d24faef3302ae9bf1308f24af84ae081310e0031c"
  }
] as const

describe("quote signing string (docs/protocol.md test vector)", () => {
  const account = privateKeyToAccount(key)
  for (const v of vectors) {
    it(`signs ${v.text}`, async () => {
      expect(quoteSigningString(v.quote as never)).toBe(v.text)
      expect(await account.signMessage({ message: v.text })).toBe(v.sig)
      expect(await recoverMessageAddress({ message: v.text, signature: v.sig })).toBe(account.address)
    })
  }

  it("a single session field does not change the signed string", () => {
    expect(quoteSigningString({ ...base, price_in_cached: 1 } as never)).toBe(vectors[0].text)
  })
})
