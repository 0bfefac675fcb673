import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { makeTurnBatches } from "../../src/process/TurnBatches.ts"

/** A batcher whose send records what it was given and answers with it (or with `answer`'s result). */
const recording = (
  maxItems?: number,
  answer?: (items: ReadonlyArray<string>) => Effect.Effect<string>,
  lingerMs?: number
) =>
  Effect.gen(function* () {
    const sent: Array<{ key: string; items: ReadonlyArray<string> }> = []
    const batches = yield* makeTurnBatches(
      (key: string, items: ReadonlyArray<string>) =>
        Effect.suspend(() => {
          sent.push({ key, items: [...items] })
          return answer?.(items) ?? Effect.succeed(items.join(","))
        }),
      maxItems,
      lingerMs
    )
    return { sent, batches }
  })

describe("work grouped by turn (D370, D545)", () => {
  it.effect(
    "a turn's items of one key go together, in order; another key's apart; a later turn's apart",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { sent, batches } = yield* recording()
          const first = yield* Effect.forEach(
            [
              ["a", "1"],
              ["b", "2"],
              ["a", "3"],
              ["a", "4"]
            ] as const,
            ([key, item]) => batches.add(key, item),
            { concurrency: "unbounded" }
          )
          assert.deepStrictEqual(first, [
            { answer: "1,3,4", index: 0 },
            { answer: "2", index: 0 },
            { answer: "1,3,4", index: 1 },
            { answer: "1,3,4", index: 2 }
          ])
          const later = yield* batches.add("a", "5")
          assert.deepStrictEqual(later, { answer: "5", index: 0 })
          assert.deepStrictEqual(sent, [
            { key: "a", items: ["1", "3", "4"] },
            { key: "b", items: ["2"] },
            { key: "a", items: ["5"] }
          ])
        })
      )
  )

  it.effect("a full batch is sent as it stands and the next item opens another", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { sent, batches } = yield* recording(2)
        const answers = yield* Effect.forEach(["1", "2", "3", "4", "5"], (item) => batches.add("k", item), {
          concurrency: "unbounded"
        })
        assert.deepStrictEqual(
          answers.map((a) => a?.answer),
          ["1,2", "1,2", "3,4", "3,4", "5"]
        )
        assert.deepStrictEqual(
          sent.map((s) => s.items),
          [["1", "2"], ["3", "4"], ["5"]]
        )
      })
    )
  )

  it.effect("a send that dies: every caller of its batch gets the defect instead of waiting forever", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { batches } = yield* recording(undefined, () => Effect.die("the statement could not be built"))
        const exits = yield* Effect.forEach(["1", "2", "3"], (item) => Effect.exit(batches.add("k", item)), {
          concurrency: "unbounded"
        }).pipe(Effect.timeout("2 seconds"))
        for (const exit of exits) {
          assert.isTrue(Exit.isFailure(exit))
          assert.isTrue(Cause.hasDies((exit as Exit.Failure<unknown, unknown>).cause))
        }
      })
    )
  )

  it.effect("at the scope's close a batch not yet sent is sent, and later items get undefined", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const { sent, batches } = yield* recording().pipe(Scope.provide(scope))
      // Added, then the scope closed before the turn ends: the fork that would send it is interrupted.
      const waiting = yield* Effect.forkDetach(batches.add("k", "1"), { startImmediately: true })
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(sent, [{ key: "k", items: ["1"] }])
      assert.isUndefined(yield* batches.add("k", "2"))
      const exit = yield* Effect.exit(Fiber.join(waiting))
      assert.deepStrictEqual(exit, Exit.succeed({ answer: "1", index: 0 }))
    })
  )

  it.effect("a lingering batch takes the items of later turns until its linger ends (D573)", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { sent, batches } = yield* recording(64, undefined, 20)
        const first = yield* Effect.forkChild(batches.add("k", "1"))
        yield* TestClock.adjust(5)
        const second = yield* Effect.forkChild(batches.add("k", "2"))
        const other = yield* Effect.forkChild(batches.add("j", "x"))
        yield* TestClock.adjust(10)
        const third = yield* Effect.forkChild(batches.add("k", "3"))
        yield* TestClock.adjust(4)
        // 19 ms after the first item: nothing sent yet.
        assert.deepStrictEqual(sent, [])
        yield* TestClock.adjust(1)
        assert.deepStrictEqual(yield* Fiber.joinAll([first, second, third]), [
          { answer: "1,2,3", index: 0 },
          { answer: "1,2,3", index: 1 },
          { answer: "1,2,3", index: 2 }
        ])
        assert.deepStrictEqual(sent, [{ key: "k", items: ["1", "2", "3"] }])
        // The other key's batch opened 5 ms later and lingers its own 20 ms.
        yield* TestClock.adjust(5)
        assert.deepStrictEqual(yield* Fiber.join(other), { answer: "x", index: 0 })
        // After the send, the next item opens a new batch.
        const later = yield* Effect.forkChild(batches.add("k", "4"))
        yield* TestClock.adjust(20)
        assert.deepStrictEqual(yield* Fiber.join(later), { answer: "4", index: 0 })
      })
    )
  )

  it.effect(
    "a lingering batch that fills up goes at the end of its turn; the close sends one still lingering",
    () =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const { sent, batches } = yield* recording(2, undefined, 1_000).pipe(Scope.provide(scope))
        const full = yield* Effect.forkChild(
          Effect.forEach(["1", "2"], (item) => batches.add("k", item), { concurrency: "unbounded" })
        )
        // No clock moved: the batch went because it filled.
        assert.deepStrictEqual(yield* Fiber.join(full), [
          { answer: "1,2", index: 0 },
          { answer: "1,2", index: 1 }
        ])
        const lingering = yield* Effect.forkChild(batches.add("k", "3"))
        yield* TestClock.adjust(10)
        assert.deepStrictEqual(sent, [{ key: "k", items: ["1", "2"] }])
        yield* Scope.close(scope, Exit.void)
        assert.deepStrictEqual(yield* Fiber.join(lingering), { answer: "3", index: 0 })
        assert.deepStrictEqual(sent, [
          { key: "k", items: ["1", "2"] },
          { key: "k", items: ["3"] }
        ])
      })
  )
})
