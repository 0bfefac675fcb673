import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { revertReason } from "../../src/chain/ChainError.ts"

/** Text a node may put around a revert: anything without the words themselves. */
const around = fc.string().filter((text) => !/execution reverted/i.test(text))

/** A reason as nodes give it: some text on the rest of the line. */
const reasonOnALine = fc
  .string()
  .filter((reason) => reason.trim() !== "" && !/[\n\r\u2028\u2029]/.test(reason))

describe("revertReason: the reason a node gives after 'execution reverted:' (ChainError, Outgoing, QuickReads)", () => {
  it("the known shapes", () => {
    assert.strictEqual(
      revertReason("execution reverted: FiatTokenV2: authorization is used or canceled"),
      "FiatTokenV2: authorization is used or canceled"
    )
    assert.strictEqual(revertReason("Execution Reverted"), "execution reverted")
    assert.strictEqual(revertReason("execution reverted:   "), "execution reverted")
    assert.strictEqual(revertReason("call failed: execution reverted: a\nsecond line"), "a")
    assert.strictEqual(revertReason("nonce too low"), undefined)
    assert.strictEqual(revertReason(""), undefined)
  })

  it("any reason on the line is kept, trimmed; a message without the words is no revert", () => {
    fc.assert(
      fc.property(around, reasonOnALine, around, (before, reason, after) => {
        assert.strictEqual(revertReason(`${before}execution reverted: ${reason}\n${after}`), reason.trim())
        assert.strictEqual(revertReason(before), undefined)
      })
    )
  })
})
