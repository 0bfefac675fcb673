import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { Instances } from "../../src/db/Instances.ts"
import { elapsedMs } from "../../src/process/ElapsedClock.ts"
import { TestDatabase } from "../support/Database.ts"

/**
 * What this instance knows of its own heartbeat (D557): since when its beats have got through with no gap
 * of half the dead-after time. With 2 s dead-after, the 5 s between beats is always such a gap.
 */
const Gappy = Instances.layer.pipe(
  Layer.provideMerge(TestDatabase),
  Layer.provide(ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ INSTANCE_DEAD_AFTER_SECONDS: "2" })))
)

describe("this instance's heartbeat, as it sees it (D557)", () => {
  layer(Gappy, { timeout: 30_000, excludeTestServices: true })((it) => {
    it.effect(
      "steady from its first beat; no time at all once a beat is overdue; steady afresh after the gap",
      () =>
        Effect.gen(function* () {
          const instances = yield* Instances
          const startedAt = elapsedMs()
          const first = instances.steadySince(startedAt)
          assert.isAtMost(first, startedAt)
          assert.isAbove(first, startedAt - 10_000)
          // One second without a beat is half of the dead-after time: nothing written before now is sure to stand.
          assert.strictEqual(instances.steadySince(startedAt + 1_500), Number.POSITIVE_INFINITY)
          // The next beat (5 s on) ends the gap: steady again from then, not from the first beat.
          yield* Effect.sleep("5500 millis")
          const again = instances.steadySince(elapsedMs())
          assert.isAbove(again, first + 4_000)
          assert.isAtMost(again, elapsedMs())
        })
    )
  })
})
