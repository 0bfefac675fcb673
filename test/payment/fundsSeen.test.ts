import { assert, describe, it } from "@effect/vitest"
import { fundsSeen } from "../../src/payment/FundsSeen.ts"

/** What vouches for a payer's next x402 call (D543): the chain's last read of its funds, for a minute. */
describe("fundsSeen", () => {
  it("vouches for a value the last read covered, within the minute only", () => {
    const seen = fundsSeen()
    assert.isFalse(seen.vouches("exact:0xa", 1n, 0), "a payer never read")
    seen.remember("exact:0xa", 100n, 1_000)
    assert.isTrue(seen.vouches("exact:0xa", 100n, 1_000))
    assert.isFalse(seen.vouches("exact:0xa", 101n, 1_000), "more than the funds read")
    assert.isFalse(seen.vouches("upto:0xa", 1n, 1_000), "another scheme's key")
    assert.isTrue(seen.vouches("exact:0xa", 1n, 61_000))
    assert.isFalse(seen.vouches("exact:0xa", 1n, 61_001), "read more than a minute ago")
    // The last read is what counts: a payer found short is no longer vouched for.
    seen.remember("exact:0xa", 0n, 2_000)
    assert.isFalse(seen.vouches("exact:0xa", 1n, 2_000))
  })

  it("forgets the payer read longest ago once 10,000 are remembered", () => {
    const seen = fundsSeen()
    for (let i = 0; i < 10_000; i++) seen.remember(`exact:${i}`, 10n, 0)
    // Read again, the first payer is the newest: the second is forgotten when one more comes.
    seen.remember("exact:0", 10n, 0)
    seen.remember("exact:new", 10n, 0)
    assert.isTrue(seen.vouches("exact:0", 1n, 0))
    assert.isFalse(seen.vouches("exact:1", 1n, 0))
    assert.isTrue(seen.vouches("exact:2", 1n, 0))
    assert.isTrue(seen.vouches("exact:new", 1n, 0))
  })
})
