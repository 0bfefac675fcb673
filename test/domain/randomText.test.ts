import { assert, describe, it } from "@effect/vitest"
import { randomText } from "../../src/domain/RandomText.ts"

describe("random text from the pooled CSPRNG", () => {
  it("hands out each draw once, of the asked length and alphabet, across pool refills", () => {
    const seen = new Set<string>()
    // 1,000 draws of 24 bytes pass the 4 KB pool about six times.
    for (let i = 0; i < 1000; i++) {
      const hex = randomText(12, "hex")
      const token = randomText(24, "base64url")
      assert.match(hex, /^[0-9a-f]{24}$/)
      assert.match(token, /^[A-Za-z0-9_-]{32}$/)
      seen.add(hex)
      seen.add(token)
    }
    assert.strictEqual(seen.size, 2000)
  })
})
