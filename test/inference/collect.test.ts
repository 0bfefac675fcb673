import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { collect } from "../../src/inference/Collect.ts"
import { keptBytesOf } from "../../src/inference/FinishedStreams.ts"
import { type LiveStream, LiveStreams } from "../../src/inference/LiveStreams.ts"
import type { Admitted, ServeEvent, ServeSummary } from "../../src/inference/Paid.ts"

/** Lets the scheduler run the fibers that are ready. */
const settle = Effect.repeat(Effect.yieldNow, { times: 20 })

const summary = { status: "ok", charged: 7 } as unknown as ServeSummary
const text = (t: string): ServeEvent => ({ _tag: "Delta", event: { _tag: "TextDelta", text: t } as never })

/** `collect` reads an admitted request's id and stream only. */
const admittedOf = (stream: LiveStream<ServeEvent>) =>
  ({ requestId: stream.id, stream }) as unknown as Admitted

/** The router's own call: `n` text events and its end, as the serving work publishes them. */
const ownCall = (live: LiveStreams["Service"], id: string, n: number) =>
  live.start<ServeEvent>(id, (publish) =>
    Effect.sync(() => {
      for (let i = 0; i < n; i++) publish(text(`w${i} `))
      publish({ _tag: "End", summary })
    })
  )

const nothingKept = keptBytesOf({ body: new Uint8Array(0), offsets: undefined })

// D558: the router's own calls (a task's rubric review, an evaluation case) are read to their end by
// `collect`; they kept every event for the registry's ten minutes, outside the replay budget.
describe("the router's own calls, read to their end", () => {
  it.effect("keep no event once read, and are read whole", () =>
    Effect.gen(function* () {
      const live = yield* LiveStreams
      const { stream } = yield* ownCall(live, "req_own", 200)
      const done = yield* collect(live, admittedOf(stream))
      assert.strictEqual(done.text, Array.from({ length: 200 }, (_, i) => `w${i} `).join(""))
      assert.strictEqual(done.summary, summary)
      yield* settle
      assert.strictEqual(stream.events.length, 0, "the events are let go")
      assert.strictEqual(stream.kept?.body.byteLength, 0, "nothing to replay is kept")
    }).pipe(Effect.provide(LiveStreams.layerWithBudget(1_000_000)))
  )

  it.effect("count in the replay budget: past it the oldest are forgotten", () =>
    Effect.gen(function* () {
      const live = yield* LiveStreams
      for (let i = 0; i < 5; i++) {
        const { stream } = yield* ownCall(live, `req_${i}`, 10)
        yield* collect(live, admittedOf(stream))
        yield* settle
      }
      // Room for two records: the three oldest are gone (before D558 none was counted, all five stayed).
      assert.deepStrictEqual(
        [0, 1, 2, 3, 4].map((i) => live.get(`req_${i}`) !== undefined),
        [false, false, false, true, true]
      )
    }).pipe(Effect.provide(LiveStreams.layerWithBudget(2 * nothingKept)))
  )

  it.effect("a reading interrupted before the end still lets the events go once the work ends", () =>
    Effect.gen(function* () {
      const live = yield* LiveStreams
      const more = yield* Deferred.make<void>()
      const { stream } = yield* live.start<ServeEvent>("req_cut", (publish) =>
        Effect.gen(function* () {
          publish(text("first "))
          yield* Deferred.await(more)
          publish(text("second "))
          publish({ _tag: "End", summary })
        })
      )
      const reading = yield* Effect.forkChild(collect(live, admittedOf(stream)))
      yield* settle
      yield* Fiber.interrupt(reading)
      // A new reader holds the work past the grace period; the events are there while it runs.
      const follower = yield* Effect.forkChild(live.awaitEnd(stream))
      assert.strictEqual(stream.events.length, 1)
      yield* Deferred.succeed(more, undefined)
      yield* Fiber.join(follower)
      yield* settle
      assert.strictEqual(stream.events.length, 0)
      assert.isDefined(stream.kept)
    }).pipe(Effect.provide(LiveStreams.layerWithBudget(1_000_000)))
  )
})
