import { once } from "node:events"
import type { Readable } from "node:stream"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeFanout } from "../../src/marketdata/Fanout.ts"

const frame = (n: number) => new TextEncoder().encode(`data: ${n}\n\n`)

/** Everything a stream still holds, then whether it ended. */
const drain = (stream: Readable) =>
  Effect.promise(async () => {
    const held: Array<Uint8Array> = []
    stream.on("data", (chunk: Uint8Array) => held.push(chunk))
    await once(stream, "end")
    return held
  })

describe("the events fan-out (D125, D233)", () => {
  it.effect(
    "every subscriber gets the same bytes at once; one that takes nothing is dropped after its queue, the others never wait",
    () =>
      Effect.gen(function* () {
        const fanout = makeFanout({ capacity: 2, queue: 3 })
        const first = frame(0)
        const fast = (yield* fanout.open(first))!
        const slow = (yield* fanout.open(first))!
        assert.isUndefined(yield* fanout.open(first), "a third subscriber is refused at capacity 2")

        const got: Array<Uint8Array> = []
        fast.on("data", (chunk: Uint8Array) => got.push(chunk))
        yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
        const frames = [1, 2, 3, 4].map(frame)
        const dropped = frames.map((f) => fanout.publish(f))
        // The slow one holds `first` and two frames: the second publish fills its queue of 3.
        assert.deepStrictEqual(dropped, [0, 1, 0, 0])
        assert.strictEqual(fanout.size(), 1)
        // Pushed synchronously: the fast subscriber has every frame before the publisher yields, the same objects.
        assert.strictEqual(got.length, 5)
        for (const [i, f] of frames.entries()) assert.strictEqual(got[i + 1], f)

        const held = yield* drain(slow)
        assert.deepStrictEqual(held, [first, frames[0], frames[1]])
        const again = yield* fanout.open(first)
        assert.isDefined(again, "the dropped subscriber's place is free")
        assert.strictEqual(fanout.size(), 2)
        fast.destroy()
        yield* Effect.promise(() => once(fast, "close"))
        yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
        assert.strictEqual(fanout.size(), 1, "a closed subscriber (the caller hung up) is released")
      })
  )
})
