import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Stream } from "effect"
import { LiveStreams } from "../../src/inference/LiveStreams.ts"

/** Lets the scheduler run the fibers that are ready (a reader told the end, a waiter resumed). */
const settle = Effect.repeat(Effect.yieldNow, { times: 20 })

// D534: a stream can end (its readers told, its reply kept) while its work still settles. Readers follow
// the stream's end; shutdown, the reaper and the reads of what was settled follow the work's.
describe("a stream's end and its work's end", () => {
  it.effect("readers end with the stream; awaitDone waits only between the stream's end and the work's", () =>
    Effect.gen(function* () {
      const live = yield* LiveStreams
      const ended = yield* Deferred.make<void>()
      const settled = yield* Deferred.make<void>()
      const { stream } = yield* live.start<string>("req_end", (publish, end) =>
        Effect.gen(function* () {
          publish("hello")
          yield* Deferred.await(ended)
          publish("the end")
          yield* end
          // After the end nothing more is published.
          publish("too late")
          yield* Deferred.await(settled)
        })
      )
      const reader = yield* Effect.forkChild(Stream.runCollect(live.follow(stream, 0)))

      // Still serving: nothing settled to wait for, so a read of what it settled does not wait.
      const early = yield* Effect.forkChild(live.awaitDone("req_end", 5_000))
      yield* settle
      assert.isDefined(early.pollUnsafe(), "awaitDone does not wait while the stream is served")
      assert.strictEqual(yield* live.running, 1)

      yield* Deferred.succeed(ended, undefined)
      yield* settle
      const events = (yield* Fiber.join(reader)).map((indexed) => indexed.event)
      assert.deepStrictEqual(events, ["hello", "the end"])
      assert.isDefined(stream.finishedAt)
      assert.isFalse(stream.done)
      // The work still runs: shutdown waits for it, and so does a read of what it settles.
      assert.strictEqual(yield* live.running, 1)
      const waiting = yield* Effect.forkChild(live.awaitDone("req_end", 5_000))
      yield* settle
      assert.isUndefined(waiting.pollUnsafe(), "awaitDone waits for the work once the stream has ended")

      yield* Deferred.succeed(settled, undefined)
      yield* Fiber.join(waiting)
      assert.isTrue(stream.done)
      assert.strictEqual(yield* live.running, 0)
    }).pipe(Effect.provide(LiveStreams.layer))
  )
})
