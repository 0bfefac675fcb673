import { constants } from "node:perf_hooks"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Metric, Scope } from "effect"
import { GcMetricsLive, gcDuration, gcKindOf } from "../../src/process/GcMetrics.ts"

const minorCount = Effect.map(
  Metric.value(Metric.withAttributes(gcDuration, { kind: "minor" })),
  (state) => state.count
)

/** Enough short-lived garbage for several young-generation collections (its default size is a few MB). */
const garbage = () => {
  // Each object outlives its loop turn (a ring of a thousand), so no compiler can leave it unallocated.
  const ring = new Array<unknown>(1_000)
  for (let i = 0; i < 2_000_000; i++) ring[i % ring.length] = { i, pair: [i, i + 1] }
  return ring.length
}

/** Until `done` holds (performance entries reach observers a turn or more after the collection), 2 s at most. */
const eventually = (done: Effect.Effect<boolean>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 100; i++) {
      if (yield* done) return true
      yield* Effect.sleep("20 millis")
    }
    return false
  })

describe("GC metrics (nodejs_gc_duration_seconds)", () => {
  it("names each kind Node reports as Prometheus's Node conventions do", () => {
    assert.strictEqual(gcKindOf(constants.NODE_PERFORMANCE_GC_MINOR), "minor")
    assert.strictEqual(gcKindOf(constants.NODE_PERFORMANCE_GC_MAJOR), "major")
    assert.strictEqual(gcKindOf(constants.NODE_PERFORMANCE_GC_INCREMENTAL), "incremental")
    assert.strictEqual(gcKindOf(constants.NODE_PERFORMANCE_GC_WEAKCB), "weakcb")
    assert.strictEqual(gcKindOf(undefined), "other")
  })

  it.live("counts the collections made while the layer is up, and none after its scope closed", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(GcMetricsLive, scope)
      const before = yield* minorCount
      garbage()
      assert.isTrue(
        yield* eventually(Effect.map(minorCount, (count) => count > before)),
        "young-generation collections counted"
      )
      const seconds = (yield* Metric.value(Metric.withAttributes(gcDuration, { kind: "minor" }))).sum
      assert.isTrue(seconds > 0, "their pauses summed, in seconds")

      yield* Scope.close(scope, Exit.void)
      // Entries of collections made before the close may still be on their way: let them land first.
      yield* Effect.sleep("100 millis")
      const closed = yield* minorCount
      garbage()
      yield* Effect.sleep("200 millis")
      assert.strictEqual(yield* minorCount, closed, "the observer was disconnected with its scope")
    })
  )
})
