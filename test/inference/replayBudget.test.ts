import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import * as fc from "fast-check"
import { FinishedStreams, keptBytesOf, RECORD_BYTES } from "../../src/inference/FinishedStreams.ts"
import { type KeptReply, LiveStreams } from "../../src/inference/LiveStreams.ts"

/** Lets the scheduler run the fibers that are ready. */
const settle = Effect.repeat(Effect.yieldNow, { times: 20 })

const reply = (bytes: number): KeptReply => ({
  contentType: "application/json",
  headers: {},
  body: new Uint8Array(bytes),
  offsets: undefined
})

// D548: the replies a process keeps for replay are bounded in bytes, the oldest let go first, never one whose
// work still runs; and by age, as before.
describe("the finished streams kept for replay", () => {
  it("a property: within the budget once trimmed but for streams still ending, each taken once, never one still ending", () =>
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 50_000 }),
        fc.array(fc.record({ bytes: fc.integer({ min: 1, max: 20_000 }), done: fc.boolean() }), {
          maxLength: 60
        }),
        (budget, streams) => {
          const kept = new FinishedStreams<number>(budget)
          const dropped: Array<number> = []
          const done = (i: number) => streams[i]!.done
          streams.forEach((s, i) => {
            kept.add(i, s.bytes, i)
            const before = dropped.length
            kept.trim(done, (d) => dropped.push(d))
            // Taken oldest first.
            const now = dropped.slice(before)
            assert.deepStrictEqual(
              now,
              [...now].sort((a, b) => a - b)
            )
            const left = streams.map((_, j) => j).filter((j) => j <= i && !dropped.includes(j))
            assert.strictEqual(
              kept.bytes,
              left.reduce((sum, j) => sum + streams[j]!.bytes, 0)
            )
            assert.strictEqual(kept.size, left.length)
            // Over the budget only with nothing left that may go.
            if (kept.bytes > budget) assert.isTrue(left.every((j) => !done(j)))
          })
          assert.strictEqual(new Set(dropped).size, dropped.length)
          assert.isTrue(dropped.every(done))
        }
      )
    ))

  it("a stream passed over while ending goes first once it has ended", () => {
    const kept = new FinishedStreams<string>(250)
    const ended = new Set(["b", "c", "d"])
    const dropped: Array<string> = []
    const trim = () =>
      kept.trim(
        (id) => ended.has(id),
        (id) => dropped.push(id)
      )
    for (const [id, at] of [
      ["a", 1],
      ["b", 2],
      ["c", 3]
    ] as const) {
      kept.add(id, 100, at)
      trim()
    }
    // Over by one: "a" is still ending, so "b" goes.
    assert.deepStrictEqual(dropped, ["b"])
    ended.add("a")
    trim()
    assert.deepStrictEqual(dropped, ["b"], "within the budget now: nothing more goes")
    kept.add("d", 100, 4)
    trim()
    assert.deepStrictEqual(dropped, ["b", "a"], "the oldest, once ended, before the newer")
  })

  it("by age: what finished before the cut goes, oldest first, what finished after stays", () => {
    const kept = new FinishedStreams<string>(Number.POSITIVE_INFINITY)
    const dropped: Array<string> = []
    for (const [id, at] of [
      ["a", 10],
      ["b", 20],
      ["c", 30]
    ] as const)
      kept.add(id, 100, at)
    kept.trim(
      () => true,
      (id) => dropped.push(id),
      25
    )
    assert.deepStrictEqual(dropped, ["a", "b"])
    assert.deepStrictEqual([kept.size, kept.bytes], [1, 100])
  })

  it("a kept reply is counted with its record", () => {
    assert.strictEqual(keptBytesOf(reply(1_000)), 1_000 + RECORD_BYTES)
    assert.strictEqual(
      keptBytesOf({ body: new Uint8Array(10), offsets: new Uint32Array(4) }),
      10 + 16 + RECORD_BYTES
    )
  })

  const each = keptBytesOf(reply(4_000))

  it.effect(
    "past the budget the registry forgets the oldest finished streams, and keeps one whose work still runs",
    () =>
      Effect.gen(function* () {
        const live = yield* LiveStreams
        // The first stream's work goes on after its end (its settlement in flight).
        const settled = yield* Deferred.make<void>()
        const first = yield* live.start<string>("req_0", (_publish, end) =>
          Effect.andThen(end, Deferred.await(settled))
        )
        live.keep(first.stream, () => reply(4_000))
        for (let i = 1; i <= 4; i++) {
          const { stream } = yield* live.start<string>(`req_${i}`, (publish) =>
            Effect.sync(() => publish("x"))
          )
          live.keep(stream, () => reply(4_000))
          yield* settle
        }
        // Three fit. The oldest is still ending: it is passed over, and the next oldest go.
        assert.deepStrictEqual(
          [0, 1, 2, 3, 4].map((i) => live.get(`req_${i}`) !== undefined),
          [true, false, false, true, true]
        )
        // Once its work ends it is the first to go when room is wanted.
        yield* Deferred.succeed(settled, undefined)
        yield* settle
        assert.isDefined(live.get("req_0"))
        // A stream still serving is never counted, however many finish after it started.
        const release = yield* Deferred.make<void>()
        const running = yield* live.start<string>("req_live", (publish) =>
          Effect.andThen(
            Effect.sync(() => publish("x")),
            Deferred.await(release)
          )
        )
        for (let i = 5; i <= 8; i++) {
          const { stream } = yield* live.start<string>(`req_${i}`, (publish) =>
            Effect.sync(() => publish("x"))
          )
          live.keep(stream, () => reply(4_000))
          yield* settle
        }
        assert.isDefined(live.get("req_live"))
        assert.deepStrictEqual(
          [4, 5, 6, 7, 8].map((i) => live.get(`req_${i}`) !== undefined),
          [false, false, true, true, true]
        )
        yield* Deferred.succeed(release, undefined)
        yield* settle
        assert.isTrue(running.stream.done)
      }).pipe(Effect.provide(LiveStreams.layerWithBudget(3 * each)))
  )
})
