import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { Latency } from "../../src/market/Latency.ts"
import {
  BUCKET_COUNT,
  defaultLatencyConfig,
  effectiveWeight,
  emptyLatencyState,
  LatencyEntry,
  type LatencyState,
  latencyEstimate,
  maturity,
  observedQuantile,
  quantile,
  record
} from "../../src/market/LatencyStats.ts"
import { providerNumber } from "../../src/market/ProviderNumbers.ts"

const HALF_LIFE = defaultLatencyConfig.halfLifeMs

const recordAll = (
  samples: ReadonlyArray<readonly [ttftMs: number, atMs: number]>,
  from = emptyLatencyState
) => samples.reduce<LatencyState>((state, [ttft, at]) => record(state, ttft, at), from)

const samplesArb = fc.array(
  fc.tuple(fc.integer({ min: 0, max: 200_000 }), fc.integer({ min: 0, max: 3_600_000 })),
  { maxLength: 300 }
)

describe("LatencyStats", () => {
  it("a cold provider reports the conservative prior", () => {
    assert.strictEqual(quantile(emptyLatencyState, 0.9, 0), defaultLatencyConfig.priorMs)
    assert.strictEqual(maturity(emptyLatencyState, 0), "cold")
    const estimate = latencyEstimate(undefined, 1_000)
    assert.strictEqual(estimate.quantile(0.5), 2_000)
    assert.strictEqual(estimate.maturity, "cold")
  })

  it("blends towards measurements as data matures, so a tight SLO passes only once measured", () => {
    let state = emptyLatencyState
    const deadline = 800
    const passes: Array<boolean> = []
    for (let i = 0; i < 25; i++) {
      state = record(state, 300, 1_000)
      passes.push(quantile(state, 0.9, 1_000) <= deadline)
    }
    assert.isFalse(passes[0])
    assert.isFalse(passes[9])
    assert.isTrue(passes[24])
    assert.strictEqual(maturity(state, 1_000), "mature")
    // mature: the prior has faded out; the estimate is the measured value (within a bucket)
    const q = quantile(state, 0.9, 1_000)
    assert.isAtMost(q, 300 * 1.2)
    assert.isAbove(q, 300 / 1.2)
  })

  it("never blends slow measurements down towards a faster prior", () => {
    const state = recordAll([
      [6_000, 0],
      [6_000, 0]
    ])
    assert.isAtLeast(quantile(state, 0.5, 0), 6_000 / 1.2)
    assert.strictEqual(maturity(state, 0), "cold")
  })

  it("maturity follows the decayed sample weight", () => {
    const three = recordAll([
      [100, 0],
      [100, 0],
      [100, 0]
    ])
    assert.strictEqual(maturity(three, 0), "warming")
    const mature = recordAll(Array.from({ length: 20 }, () => [100, 0] as const))
    assert.strictEqual(maturity(mature, 0), "mature")
    assert.closeTo(effectiveWeight(mature, HALF_LIFE), 10, 1e-9)
    assert.strictEqual(maturity(mature, HALF_LIFE), "warming")
    assert.strictEqual(maturity(mature, 5 * HALF_LIFE), "cold")
    // stale data drifts back to the prior
    assert.isAbove(quantile(mature, 0.5, 20 * HALF_LIFE), 1_900)
  })

  it("quantile is monotone in q, at any time", () => {
    fc.assert(
      fc.property(
        samplesArb,
        fc.double({ min: 0, max: 1, noNaN: true }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        fc.integer({ min: 0, max: 7_200_000 }),
        (samples, a, b, now) => {
          const state = recordAll(samples)
          const [lo, hi] = a <= b ? [a, b] : [b, a]
          assert.isAtMost(quantile(state, lo, now), quantile(state, hi, now))
          const observedLo = observedQuantile(state, lo)
          const observedHi = observedQuantile(state, hi)
          if (observedLo !== undefined && observedHi !== undefined) assert.isAtMost(observedLo, observedHi)
        }
      )
    )
  })

  it("observed quantiles are within one bucket of the empirical quantile", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 20, max: 100_000 }), { minLength: 1, maxLength: 200 }),
        fc.double({ min: 0.01, max: 1, noNaN: true }),
        (values, q) => {
          const state = recordAll(values.map((v) => [v, 0] as const))
          const sorted = [...values].sort((x, y) => x - y)
          const empirical = sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)] ?? 0
          const estimate = observedQuantile(state, q) ?? Number.NaN
          assert.isAtMost(estimate, empirical * 1.2 + 1e-6)
          assert.isAtLeast(estimate, empirical / 1.2 - 1e-6)
        }
      )
    )
  })

  it("decays toward new data", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1_500, max: 20_000 }),
        fc.integer({ min: 50, max: 500 }),
        fc.integer({ min: 5, max: 50 }),
        (oldMs, newMs, n) => {
          const old = recordAll(Array.from({ length: n }, () => [oldMs, 0] as const))
          const later = 8 * HALF_LIFE
          const fresh = recordAll(
            Array.from({ length: n }, () => [newMs, later] as const),
            old
          )
          // n fresh samples outweigh n samples eight half-lives old 256:1
          const median = observedQuantile(fresh, 0.5) ?? Number.NaN
          assert.isAtMost(median, newMs * 1.2)
          assert.isBelow(observedQuantile(fresh, 0.99) ?? Number.NaN, oldMs / 1.2)
        }
      )
    )
  })

  it("uses bounded memory whatever the number of samples", () => {
    fc.assert(
      fc.property(samplesArb, (samples) => {
        const state = recordAll(samples)
        assert.strictEqual(state.weights.length, BUCKET_COUNT)
        const weight = effectiveWeight(state, state.atMs)
        assert.isAtMost(weight, samples.length + 1e-6)
      })
    )
  })

  it("is immutable and tolerates a clock stepping backwards", () => {
    const a = record(emptyLatencyState, 100, 10_000)
    const b = record(a, 100, 5_000)
    assert.strictEqual(
      emptyLatencyState.weights.reduce((s, w) => s + w, 0),
      0
    )
    assert.strictEqual(
      a.weights.reduce((s, w) => s + w, 0),
      1
    )
    assert.strictEqual(b.atMs, 10_000)
    assert.closeTo(effectiveWeight(b, 10_000), 2, 1e-9)
    assert.throws(() => record(a, -1, 0), RangeError)
  })

  it("an auction's estimate answers what quantile() and maturity() answer, at and around every maturity threshold", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 20_000 }), { minLength: 0, maxLength: 60, size: "max" }),
        fc.oneof(
          fc.integer({ min: 0, max: 3 * HALF_LIFE }),
          // Around the moment the weight decays through 20 (mature) or 3 (warming): the estimate skips
          // the power only where the weight is certainly mature.
          fc.tuple(fc.constantFrom(20, 3), fc.integer({ min: -2_000, max: 2_000 })),
          // Around the time up to which the entry hands its one mature estimate.
          fc.integer({ min: -2_000, max: 2_000 }).map((jitter) => ({ jitter }))
        ),
        fc.array(fc.double({ min: 0.01, max: 0.99, noNaN: true }), { minLength: 1, maxLength: 3 }),
        (values, when, qs) => {
          const state = recordAll(values.map((v) => [v, 1_000] as const))
          const total = values.length
          const bound = new LatencyEntry(state).steadyUntilMs - 1_000
          const elapsed =
            typeof when === "number"
              ? when
              : "jitter" in when
                ? Math.max(0, (Number.isFinite(bound) ? Math.round(bound) : 0) + when.jitter)
                : Math.max(0, Math.round(HALF_LIFE * Math.log2(total / when[0]!)) + when[1]!)
          const now = 1_000 + (Number.isFinite(elapsed) ? elapsed : 0)
          const estimate = latencyEstimate(state, now)
          assert.strictEqual(estimate.maturity, maturity(state, now))
          for (const q of [...qs, 0.9, ...qs])
            assert.strictEqual(estimate.quantile(q), quantile(state, q, now))
        }
      ),
      { numRuns: 1_000 }
    )
  })
})

describe("Latency service", () => {
  it("finds a provider by its number as by its id (D304)", () => {
    const lookup = Effect.runSync(
      Effect.gen(function* () {
        const latency = yield* Latency
        for (let i = 0; i < 30; i++) {
          yield* latency.observe("lat-fast", "chat-small", 150)
          yield* latency.observe("lat-slow", "chat-small", 3_000)
          yield* latency.observe("lat-slow", "chat-large", 900)
        }
        return yield* latency.lookup
      }).pipe(Effect.provide(Latency.layer))
    )
    const fast = providerNumber("lat-fast")
    const slow = providerNumber("lat-slow")
    assert.notStrictEqual(fast, slow)
    for (const [id, number, classId] of [
      ["lat-fast", fast, "chat-small"],
      ["lat-slow", slow, "chat-small"],
      ["lat-slow", slow, "chat-large"],
      ["lat-fast", fast, "chat-large"]
    ] as const) {
      const byId = lookup(id, classId)
      const byNumber = lookup(id, classId, number)
      assert.strictEqual(byNumber.quantile(0.9), byId.quantile(0.9))
      assert.strictEqual(byNumber.maturity, byId.maturity)
    }
    assert.isBelow(lookup("lat-fast", "chat-small", fast).quantile(0.9), 200)
    assert.isAbove(lookup("lat-slow", "chat-small", slow).quantile(0.9), 2_500)
    assert.strictEqual(lookup("lat-fast", "chat-large", fast).maturity, "cold")
    assert.strictEqual(lookup("lat-never-seen", "chat-small").quantile(0.9), defaultLatencyConfig.priorMs)
  })
})
