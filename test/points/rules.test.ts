import { assert, describe, it } from "@effect/vitest"
import * as fc from "fast-check"
import {
  baseEarn,
  bountyOf,
  challengeStake,
  earnOf,
  MIN_CHALLENGE_STAKE,
  pointsOf,
  providerScore,
  slashOf,
  tierOf
} from "../../src/points/Earn.ts"
import { intentWindow } from "../../src/points/RewardIntent.ts"

const charge = fc.integer({ min: 0, max: 10 ** 13 })

describe("points rules (pure)", () => {
  it("100 points per unit: one point per 10,000 base units, rounded down", () => {
    assert.strictEqual(pointsOf(1_000_000), 100)
    assert.strictEqual(pointsOf(9_999), 0)
    assert.strictEqual(pointsOf(10_000), 1)
    assert.strictEqual(pointsOf(2_599_999), 259)
  })

  it("the stake at its boundary: max(25, base earn)", () => {
    // A receipt whose base earn is below 25 points stakes 25; at and above, its base earn.
    assert.deepStrictEqual([baseEarn(249_999), challengeStake(249_999)], [24, 25])
    assert.deepStrictEqual([baseEarn(250_000), challengeStake(250_000)], [25, 25])
    assert.deepStrictEqual([baseEarn(260_000), challengeStake(260_000)], [26, 26])
    assert.deepStrictEqual([baseEarn(0), challengeStake(0)], [0, 25])
    fc.assert(
      fc.property(charge, (charged) => {
        const stake = challengeStake(charged)
        return (
          stake >= MIN_CHALLENGE_STAKE &&
          stake >= baseEarn(charged) &&
          (stake === MIN_CHALLENGE_STAKE || stake === baseEarn(charged))
        )
      })
    )
  })

  it("earn rounds once, on the sum: settled + pending is the points of everything charged", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(charge, fc.boolean()), { maxLength: 50 }), (receipts) => {
        const settled = receipts.filter(([, landed]) => landed).reduce((a, [c]) => a + c, 0)
        const pending = receipts.filter(([, landed]) => !landed).reduce((a, [c]) => a + c, 0)
        const earn = earnOf(settled, pending)
        return (
          earn.settled === pointsOf(settled) &&
          earn.settled + earn.pending === pointsOf(settled + pending) &&
          earn.pending >= 0 &&
          // never less than the per-receipt rounding would give
          earn.settled + earn.pending >= receipts.reduce((a, [c]) => a + pointsOf(c), 0)
        )
      })
    )
  })

  it("an upheld challenge slashes its stake and pays the challenger half, rounded down", () => {
    assert.deepStrictEqual([slashOf(25), bountyOf(slashOf(25))], [25, 12])
    assert.deepStrictEqual([slashOf(40), bountyOf(slashOf(40))], [40, 20])
  })

  it("tiers by score, each with the next threshold", () => {
    assert.deepStrictEqual(tierOf(0), { tier: "member", next: { name: "bronze", at: 100 } })
    assert.deepStrictEqual(tierOf(99), { tier: "member", next: { name: "bronze", at: 100 } })
    assert.deepStrictEqual(tierOf(100), { tier: "bronze", next: { name: "silver", at: 1_000 } })
    assert.deepStrictEqual(tierOf(10_000), { tier: "gold", next: { name: "platinum", at: 100_000 } })
    assert.deepStrictEqual(tierOf(5_000_000), { tier: "platinum", next: null })
    assert.deepStrictEqual(tierOf(-3).tier, "member")
  })

  it("provider score: served points scaled by reliability, less slashes; exact past 2^53", () => {
    assert.strictEqual(providerScore({ settledCharged: 0, receipts: 0, receiptsOk: 0, slashed: 0 }), 0)
    assert.strictEqual(
      providerScore({ settledCharged: 1_000_000, receipts: 4, receiptsOk: 3, slashed: 10 }),
      65
    )
    const big = { settledCharged: 9 * 10 ** 14, receipts: 10 ** 9, receiptsOk: 10 ** 9 - 1, slashed: 0 }
    assert.strictEqual(providerScore(big), 89_999_999_910)
  })

  it("a reward intent is valid up to 300 s after issued_at and 5 s before it", () => {
    assert.strictEqual(intentWindow(1_000, 1_300), "valid")
    assert.strictEqual(intentWindow(1_000, 1_301), "expired")
    assert.strictEqual(intentWindow(1_005, 1_000), "valid")
    assert.strictEqual(intentWindow(1_006, 1_000), "not_yet_valid")
  })
})
