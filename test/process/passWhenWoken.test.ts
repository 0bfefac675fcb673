import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Scope } from "effect"
import { TestClock } from "effect/testing"
import { passWhenWoken, repeatInBackground } from "../../src/Background.ts"

/**
 * A pass that takes what is queued and records when it ran (test time since the start), with `work` queued
 * in between by the test; `fail` makes the next pass fail once.
 */
const harness = Effect.gen(function* () {
  const started = yield* Clock.currentTimeMillis
  const state = { queued: 0, fail: false, runs: [] as Array<number>, taken: [] as Array<number> }
  const pass = Effect.gen(function* () {
    state.runs.push((yield* Clock.currentTimeMillis) - started)
    if (state.fail) {
      state.fail = false
      return yield* Effect.fail("broken")
    }
    state.taken.push(state.queued)
    state.queued = 0
  })
  return { state, pass }
})

describe("passWhenWoken (D572): a background pass that runs only while it has work", () => {
  it.effect("an idle pass does not run at all, where repeatInBackground's runs every `every`", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const woken = yield* harness
        const polled = yield* harness
        yield* passWhenWoken(woken.pass, { every: "20 millis", pending: () => false, failure: "f" })
        yield* repeatInBackground(polled.pass, { every: "20 millis", failure: "f" })
        yield* TestClock.adjust("10 seconds")
        assert.deepStrictEqual(woken.state.runs, [])
        assert.isAtLeast(polled.state.runs.length, 500)
      })
    )
  )

  it.effect("a wake runs one pass `every` later, with everything queued by then", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { state, pass } = yield* harness
        const wake = yield* passWhenWoken(pass, {
          every: "20 millis",
          pending: () => state.queued > 0,
          failure: "f"
        })
        yield* TestClock.adjust("1 second")
        state.queued++
        wake()
        yield* TestClock.adjust("10 millis")
        assert.deepStrictEqual(state.runs, [])
        state.queued++
        wake()
        state.queued++
        wake()
        yield* TestClock.adjust("10 millis")
        assert.deepStrictEqual(state.runs, [1020])
        assert.deepStrictEqual(state.taken, [3])
        // Nothing left: no pass until the next wake.
        yield* TestClock.adjust("5 seconds")
        assert.deepStrictEqual(state.runs, [1020])
        state.queued++
        wake()
        yield* TestClock.adjust("20 millis")
        assert.deepStrictEqual(state.runs, [1020, 6040])
        assert.deepStrictEqual(state.taken, [3, 1])
      })
    )
  )

  it.effect("while work is pending the pass runs every `every`, and stops when none is left", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { state, pass } = yield* harness
        let owed = 3
        const counted = Effect.andThen(
          Effect.sync(() => {
            owed--
          }),
          pass
        )
        yield* passWhenWoken(counted, { every: "50 millis", pending: () => owed > 0, failure: "f" })
        yield* TestClock.adjust("2 seconds")
        assert.deepStrictEqual(state.runs, [50, 100, 150])
      })
    )
  )

  it.effect("with `idleEvery` an unwoken pass still runs that often (a sweep), and a wake comes sooner", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { state, pass } = yield* harness
        const wake = yield* passWhenWoken(pass, {
          every: "50 millis",
          pending: () => state.queued > 0,
          idleEvery: "2 seconds",
          failure: "f"
        })
        yield* TestClock.adjust("4100 millis")
        assert.deepStrictEqual(state.runs, [2050, 4100])
        state.queued++
        wake()
        yield* TestClock.adjust("50 millis")
        assert.deepStrictEqual(state.runs, [2050, 4100, 4150])
        yield* TestClock.adjust("2050 millis")
        assert.deepStrictEqual(state.runs, [2050, 4100, 4150, 6200])
      })
    )
  )

  it.effect("work queued while a pass runs is taken by a pass after it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const started = yield* Clock.currentTimeMillis
        const runs: Array<number> = []
        let queued = 0
        let wake = () => {}
        const pass = Effect.gen(function* () {
          runs.push((yield* Clock.currentTimeMillis) - started)
          queued = 0
          // A statement under way: something is queued (and woken) while the pass waits for it.
          yield* Effect.sleep("5 millis")
          if (runs.length === 1) {
            queued++
            wake()
          }
        })
        wake = yield* passWhenWoken(pass, { every: "20 millis", pending: () => queued > 0, failure: "f" })
        queued++
        wake()
        yield* TestClock.adjust("1 second")
        assert.deepStrictEqual(runs, [20, 45])
      })
    )
  )

  it.effect("a failed pass is logged and the next wake runs again", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { state, pass } = yield* harness
        const wake = yield* passWhenWoken(pass, {
          every: "20 millis",
          pending: () => false,
          failure: "f",
          level: "warning"
        })
        state.fail = true
        wake()
        yield* TestClock.adjust("20 millis")
        wake()
        yield* TestClock.adjust("20 millis")
        assert.deepStrictEqual(state.runs, [20, 40])
        assert.deepStrictEqual(state.taken, [0])
      })
    )
  )

  it.effect("the loop ends with its scope: a wake after that runs nothing", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { state, pass } = yield* harness
        const scope = yield* Scope.make()
        const wake = yield* passWhenWoken(pass, {
          every: "20 millis",
          pending: () => false,
          failure: "f"
        }).pipe(Scope.provide(scope))
        wake()
        yield* TestClock.adjust("20 millis")
        yield* Scope.close(scope, Exit.void)
        wake()
        yield* TestClock.adjust("1 second")
        assert.deepStrictEqual(state.runs, [20])
      })
    )
  )
})
