import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import {
  charge,
  chargeExact,
  chargeNumerator,
  feeSplit,
  ROUTER_FEE_BPS,
  worstCase
} from "../../src/domain/Billing.ts"

const count = fc.integer({ min: 0, max: 2_000_000 })
const price = fc.integer({ min: 0, max: 100_000_000 })
const tokensArb = fc
  .record({ input: count, cachedFraction: fc.double({ min: 0, max: 1, noNaN: true }), output: count })
  .map(({ input, cachedFraction, output }) => ({
    input,
    cachedInput: Math.floor(input * cachedFraction),
    output
  }))
const tariffArb = fc.record({
  price_in: price,
  price_out: price,
  price_in_cached: fc.option(price, { nil: undefined })
})

/** The exact rational cost in base units, as a bigint numerator over 1e6. */
const exactNumerator = (
  t: { input: number; cachedInput: number; output: number },
  p: { price_in: number; price_out: number; price_in_cached?: number | undefined }
): bigint =>
  BigInt(t.input - t.cachedInput) * BigInt(p.price_in) +
  BigInt(t.cachedInput) * BigInt(p.price_in_cached ?? p.price_in) +
  BigInt(t.output) * BigInt(p.price_out)

describe("Billing.charge", () => {
  it("charges per million tokens, rounding up to the base unit", () => {
    // 1,000 input at $3/1M = 3,000 base units; 500 output at $15/1M = 7,500
    assert.strictEqual(
      charge({ input: 1_000, cachedInput: 0, output: 500 }, { price_in: 3_000_000, price_out: 15_000_000 }),
      10_500
    )
    // 1 token at 1 base unit per 1M is 0.000001 base units: rounds up to 1
    assert.strictEqual(charge({ input: 1, cachedInput: 0, output: 0 }, { price_in: 1, price_out: 0 }), 1)
    // cached prefix at the cached rate
    assert.strictEqual(
      charge(
        { input: 1_000_000, cachedInput: 600_000, output: 0 },
        { price_in: 1_000_000, price_out: 0, price_in_cached: 100_000 }
      ),
      400_000 + 60_000
    )
    // a null cached price bills cached tokens at price_in
    assert.strictEqual(
      charge(
        { input: 10, cachedInput: 10, output: 0 },
        { price_in: 1_000_000, price_out: 0, price_in_cached: null }
      ),
      10
    )
  })

  it("the plain-number fast path equals the bigint path, near 2^53 and at rounding edges too", () => {
    const count = fc.oneof(
      fc.integer({ min: 0, max: 2_000_000 }),
      fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
      fc.constantFrom(0, 1, 999_999, 1_000_000, 1_000_001)
    )
    const price = fc.oneof(
      fc.integer({ min: 0, max: 50_000_000 }),
      fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
      fc.constantFrom(0, 1, 999_999, 1_000_000, 1_000_001)
    )
    fc.assert(
      fc.property(
        count,
        count,
        count,
        price,
        price,
        fc.option(price),
        (a, b, output, priceIn, priceOut, cached) => {
          const tokens = { input: Math.max(a, b), cachedInput: Math.min(a, b), output }
          const tariff = { price_in: priceIn, price_out: priceOut, price_in_cached: cached }
          let exact: number | string
          try {
            exact = chargeExact(tokens, tariff)
          } catch (error) {
            exact = String(error)
          }
          let fast: number | string
          try {
            fast = charge(tokens, tariff)
          } catch (error) {
            fast = String(error)
          }
          assert.strictEqual(fast, exact)
        }
      ),
      { numRuns: 5_000 }
    )
  })

  it("is exact to the rounding: exact cost <= charge < exact cost + 1", () => {
    fc.assert(
      fc.property(tokensArb, tariffArb, (t, p) => {
        const n = exactNumerator(t, p)
        const c = BigInt(charge(t, p))
        assert.strictEqual(chargeNumerator(t, p), n)
        assert.isTrue(c * 1_000_000n >= n)
        assert.isTrue(c * 1_000_000n < n + 1_000_000n)
        assert.isTrue(c >= 0n)
      })
    )
  })

  it("is zero for zero tokens", () => {
    fc.assert(
      fc.property(tariffArb, (p) => assert.strictEqual(charge({ input: 0, cachedInput: 0, output: 0 }, p), 0))
    )
  })

  it("is monotone in token counts and prices", () => {
    fc.assert(
      fc.property(tokensArb, tariffArb, count, count, price, price, (t, p, dIn, dOut, dPin, dPout) => {
        const base = charge(t, p)
        assert.isAtLeast(charge({ ...t, input: t.input + dIn }, p), base)
        assert.isAtLeast(charge({ ...t, output: t.output + dOut }, p), base)
        assert.isAtLeast(charge(t, { ...p, price_in: p.price_in + dPin }), base)
        assert.isAtLeast(charge(t, { ...p, price_out: p.price_out + dPout }), base)
      })
    )
  })

  it("worstCase is the charge of the whole prompt plus max_tokens of output", () => {
    fc.assert(
      fc.property(count, count, tariffArb, (prompt, max, p) => {
        assert.strictEqual(
          worstCase(prompt, max, p),
          charge({ input: prompt, cachedInput: 0, output: max }, p)
        )
        assert.isAtLeast(
          worstCase(prompt, max, p),
          charge({ input: prompt, cachedInput: 0, output: Math.max(0, max - 1) }, p)
        )
      })
    )
  })

  it("rejects programmer errors with RangeError", () => {
    const p = { price_in: 1, price_out: 1 }
    assert.throws(() => charge({ input: -1, cachedInput: 0, output: 0 }, p), RangeError)
    assert.throws(() => charge({ input: 1.5, cachedInput: 0, output: 0 }, p), RangeError)
    assert.throws(() => charge({ input: 1, cachedInput: 2, output: 0 }, p), RangeError)
    assert.throws(
      () => charge({ input: 1, cachedInput: 0, output: 0 }, { price_in: -1, price_out: 0 }),
      RangeError
    )
    assert.throws(
      () =>
        charge(
          { input: Number.MAX_SAFE_INTEGER, cachedInput: 0, output: 0 },
          { price_in: 1e15, price_out: 0 }
        ),
      RangeError
    )
  })
})

describe("Billing.feeSplit", () => {
  it("takes 7% rounded half-up", () => {
    assert.strictEqual(ROUTER_FEE_BPS, 700)
    assert.deepStrictEqual(feeSplit(10_000), { routerFee: 700, providerShare: 9_300 })
    // 50 * 0.07 = 3.5 -> 4 (half-up); 7 * 0.07 = 0.49 -> 0; 150 * 0.07 = 10.5 -> 11
    assert.deepStrictEqual(feeSplit(50), { routerFee: 4, providerShare: 46 })
    assert.deepStrictEqual(feeSplit(7), { routerFee: 0, providerShare: 7 })
    assert.deepStrictEqual(feeSplit(150), { routerFee: 11, providerShare: 139 })
    assert.deepStrictEqual(feeSplit(0), { routerFee: 0, providerShare: 0 })
  })

  it("sums exactly and rounds the fee to the nearest base unit", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }), (amount) => {
        const { routerFee, providerShare } = feeSplit(amount)
        assert.strictEqual(BigInt(routerFee) + BigInt(providerShare), BigInt(amount))
        assert.isAtLeast(providerShare, 0)
        // |fee - 7% of amount| <= 0.5, with exact halves rounding up
        const twiceError = 2n * (BigInt(routerFee) * 10_000n - BigInt(amount) * 700n)
        assert.isTrue(twiceError <= 10_000n && twiceError > -10_000n)
      })
    )
  })
})
