import * as fc from "fast-check"
import { chargeNumerator } from "../../src/domain/Billing.ts"
import type { ClearRecord } from "../../src/marketdata/Series.ts"

/** A clearing record as the window holds it, its charge from the billing formula. */
export const clearRecord = (
  id: number,
  r: {
    readonly at: number
    readonly cls: string
    readonly provider: string
    readonly input: number
    readonly output: number
    readonly priceIn: number
    readonly priceOut: number
    readonly ttft: number
  }
): ClearRecord => {
  const num = Number(
    chargeNumerator(
      { input: r.input, cachedInput: 0, output: r.output },
      { price_in: r.priceIn, price_out: r.priceOut }
    )
  )
  return {
    id,
    requestId: `r${id}`,
    at: r.at,
    modelClass: r.cls,
    provider: r.provider,
    profile: "balanced",
    priceIn: r.priceIn,
    priceOut: r.priceOut,
    tokensIn: r.input,
    tokensOut: r.output,
    tokensCached: 0,
    chargeNum: num,
    charged: Math.ceil(num / 1_000_000),
    ttftMs: r.ttft,
    priceSetter: "runner-up",
    quotesCompeting: 1
  }
}

/** Up to 80 clears made by `arbClear` (numbered from 1), and the same in a random arrival order. */
export const historyOf = (arbClear: (id: number) => fc.Arbitrary<ClearRecord>) =>
  fc
    .integer({ min: 0, max: 80 })
    .chain((n) => fc.tuple(...Array.from({ length: n }, (_, i) => arbClear(i + 1))))
    .chain((clears) =>
      fc.tuple(fc.constant(clears), fc.shuffledSubarray(clears, { minLength: clears.length }))
    )
