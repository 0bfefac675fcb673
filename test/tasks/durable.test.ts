import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Result, Scope } from "effect"
import { TestClock } from "effect/testing"
import { databaseFromUrl } from "../../src/db/Database.ts"
import { Keys } from "../../src/payment/Keys.ts"
import { TaskBudgets } from "../../src/payment/TaskBudgets.ts"
import { TaskEvents } from "../../src/tasks/TaskEvents.ts"
import { Tasks } from "../../src/tasks/Tasks.ts"
import { freshDatabaseUrl } from "../support/Database.ts"

/**
 * Issue 14 item 10: durable for real. Each "instance" is the task services over its own connection
 * pool and its own LISTEN connection, on one database shared by all, as two routers would be.
 */

const instanceLayer = (url: string) =>
  Tasks.layer.pipe(
    Layer.provideMerge(Layer.mergeAll(TaskEvents.layer, Keys.layer, TaskBudgets.layer)),
    Layer.provideMerge(databaseFromUrl(url))
  )

/** Starts an instance in its own scope (closing the scope stops it, as a router's exit would). */
const startInstance = (url: string) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(instanceLayer(url), scope)
    return {
      tasks: Context.get(context, Tasks),
      budgets: Context.get(context, TaskBudgets),
      stop: Scope.close(scope, Exit.void)
    }
  })

const task = { goal: "durable", max_steps: 10, budget: 0 }

const failureCode = <A, E extends { readonly _tag: string; readonly code?: string }>(
  effect: Effect.Effect<A, E>
) =>
  Effect.map(Effect.result(effect), (result) =>
    Result.isSuccess(result) ? "ok" : `${result.failure._tag}:${result.failure.code ?? ""}`
  )

describe("durable tasks across workers and router instances", () => {
  it.live(
    "a reader waiting on an empty log is woken by an event another instance appends, and answers empty at the bound",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* freshDatabaseUrl
          const a = yield* startInstance(url)
          const b = yield* startInstance(url)
          const { task: created, token } = yield* a.tasks.create(task, {})
          const credentials = { token }
          const cursor = (yield* b.tasks.events(created.id, credentials, {
            cursor: 0,
            waitMs: 0,
            limit: 100
          })).at(-1)!.seq

          const started = Date.now()
          const reader = yield* Effect.forkChild(
            b.tasks.events(created.id, credentials, { cursor, waitMs: 20_000, limit: 100 })
          )
          yield* Effect.sleep("300 millis")
          yield* a.tasks.append(created.id, credentials, { type: "note", data: { n: 1 } })
          const woken = yield* Fiber.join(reader)
          assert.deepStrictEqual(
            woken.map((e) => e.type),
            ["note"]
          )
          assert.isBelow(Date.now() - started, 10_000)

          const idleStart = Date.now()
          const idle = yield* b.tasks.events(created.id, credentials, {
            cursor: woken[0]!.seq,
            waitMs: 1_200,
            limit: 100
          })
          assert.deepStrictEqual(idle, [])
          assert.isAtLeast(Date.now() - idleStart, 1_100)
          yield* a.stop
          yield* b.stop
        })
      ),
    60_000
  )

  it.live(
    "events stay strictly ordered under concurrent appends from two instances, and the cursor survives a restart",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* freshDatabaseUrl
          const a = yield* startInstance(url)
          const b = yield* startInstance(url)
          const { task: created, token } = yield* a.tasks.create(task, {})
          const credentials = { token }
          yield* Effect.forEach(
            Array.from({ length: 40 }, (_, i) => i),
            (i) => (i % 2 === 0 ? a : b).tasks.append(created.id, credentials, { type: "tick", data: { i } }),
            { concurrency: 8, discard: true }
          )
          const firstPage = yield* b.tasks.events(created.id, credentials, {
            cursor: 0,
            waitMs: 0,
            limit: 20
          })
          const cursor = firstPage.at(-1)!.seq
          // The router restarts between reads; the cursor is a sequence number in the database.
          yield* a.stop
          yield* b.stop
          const c = yield* startInstance(url)
          yield* c.tasks.append(created.id, credentials, { type: "after-restart", data: null })
          const rest = yield* c.tasks.events(created.id, credentials, { cursor, waitMs: 0, limit: 500 })
          const all = [...firstPage, ...rest]
          assert.deepStrictEqual(
            all.map((e) => e.seq),
            Array.from({ length: 42 }, (_, i) => i + 1)
          )
          assert.strictEqual(all.filter((e) => e.type === "tick").length, 40)
          assert.strictEqual(all.at(-1)!.type, "after-restart")
          yield* c.stop
        })
      ),
    60_000
  )

  it.live(
    "two workers race for one lease: exactly one wins",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* freshDatabaseUrl
          const a = yield* startInstance(url)
          const b = yield* startInstance(url)
          for (let round = 0; round < 5; round++) {
            const { task: created, token } = yield* a.tasks.create(task, {})
            const outcomes = yield* Effect.all(
              [
                failureCode(a.tasks.claim(created.id, { token }, { worker: "a" })),
                failureCode(b.tasks.claim(created.id, { token }, { worker: "b" }))
              ],
              { concurrency: "unbounded" }
            )
            assert.deepStrictEqual([...outcomes].sort(), ["Conflict:lease_held", "ok"])
          }
          yield* a.stop
          yield* b.stop
        })
      ),
    60_000
  )

  it.effect(
    "a worker killed mid-task: its successor recovers the last checkpoint and the unfinished effects, the stale fence is refused",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* freshDatabaseUrl
          const a = yield* startInstance(url)
          const { task: created, token } = yield* a.tasks.create(task, {})
          const credentials = { token }

          const first = yield* a.tasks.claim(created.id, credentials, { worker: "w1", lease_seconds: 30 })
          assert.isFalse(first.recovered)
          const fence1 = first.lease.fence
          yield* a.tasks.checkpoint(created.id, credentials, { fence: fence1, execution: { step: 1 } })
          const sent = yield* a.tasks.beginEffect(created.id, "email-1", credentials, { fence: fence1 })
          assert.isTrue(sent.proceed)
          yield* a.tasks.resolveEffect(created.id, "email-1", credentials, "completed", { fence: fence1 })
          yield* a.tasks.checkpoint(created.id, credentials, { fence: fence1, execution: { step: 2 } })
          const charge = yield* a.tasks.beginEffect(created.id, "charge-1", credentials, { fence: fence1 })
          assert.isTrue(charge.proceed)
          // w1 dies here: no completion, no renewal. A live lease keeps w2 out...
          assert.strictEqual(
            yield* failureCode(a.tasks.claim(created.id, credentials, { worker: "w2" })),
            "Conflict:lease_held"
          )
          // ...until it expires.
          yield* TestClock.adjust("31 seconds")
          const second = yield* a.tasks.claim(created.id, credentials, { worker: "w2", lease_seconds: 30 })
          assert.isTrue(second.recovered)
          assert.isAbove(second.lease.fence, fence1)
          assert.deepStrictEqual(second.latest_checkpoint?.execution, { step: 2 })
          assert.deepStrictEqual(
            second.unresolved_effects.map((e) => e.effect_id),
            ["charge-1"]
          )
          // The successor asks again before acting: the record, not a second go-ahead.
          const again = yield* a.tasks.beginEffect(created.id, "charge-1", credentials, {
            fence: second.lease.fence
          })
          assert.isFalse(again.proceed)
          assert.strictEqual(again.effect.state, "begun")
          // The dead worker's writes carry a stale fence.
          assert.strictEqual(
            yield* failureCode(
              a.tasks.checkpoint(created.id, credentials, { fence: fence1, execution: { step: 3 } })
            ),
            "Conflict:stale_fence"
          )
          assert.strictEqual(
            yield* failureCode(
              a.tasks.resolveEffect(created.id, "charge-1", credentials, "completed", { fence: fence1 })
            ),
            "Conflict:stale_fence"
          )
          assert.strictEqual(
            yield* failureCode(a.tasks.claim(created.id, credentials, { lease_id: first.lease.lease_id })),
            "Conflict:lease_lost"
          )
          // The successor renews its own lease (same fence) and resolves the effect.
          const renewed = yield* a.tasks.claim(created.id, credentials, { lease_id: second.lease.lease_id })
          assert.isTrue(renewed.renewed)
          assert.strictEqual(renewed.lease.fence, second.lease.fence)
          yield* a.tasks.resolveEffect(created.id, "charge-1", credentials, "abandoned", {
            fence: second.lease.fence
          })
          const view = yield* a.tasks.view(created.id, credentials)
          assert.deepStrictEqual(view.unresolved_effects, [])
          assert.strictEqual(view.state, "running")
          yield* a.stop
        })
      ),
    60_000
  )

  it.effect("the retention reaper erases a task once its retention runs out", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const url = yield* freshDatabaseUrl
        const a = yield* startInstance(url)
        const { task: created, token } = yield* a.tasks.create({ ...task, retention_hours: 1 }, {})
        assert.strictEqual(yield* a.tasks.reap, 0)
        assert.strictEqual(yield* failureCode(a.tasks.view(created.id, { token })), "ok")
        yield* TestClock.adjust("61 minutes")
        // The instance's own reaper runs every minute of the test clock and may erase the task before
        // this pass does (then this pass finds nothing); either way it is gone once a pass has run.
        yield* a.tasks.reap
        assert.strictEqual(
          yield* failureCode(a.tasks.view(created.id, { token })),
          "Unauthorized:invalid_task_token"
        )
        yield* a.stop
      })
    )
  )

  it.effect(
    "a hold its instance never closed (a crash mid-call) is settled by the sweep once no request can be serving",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const url = yield* freshDatabaseUrl
          const a = yield* startInstance(url)
          const { task: created, token } = yield* a.tasks.create({ ...task, budget: 1_000 }, {})
          // The request's scope is never closed: its instance died with the hold taken.
          const requestScope = yield* Scope.make()
          yield* a.budgets
            .hold({ task: { token }, requestId: "req_dead", worstCase: 600 })
            .pipe(Scope.provide(requestScope))
          const held = yield* a.tasks.view(created.id, { token })
          assert.deepInclude(held, { held: 600, steps: 1, remaining: 400 })
          // A second call cannot take what the dead one holds.
          const refused = yield* Effect.flip(
            Effect.scoped(a.budgets.hold({ task: { token }, requestId: "req_next", worstCase: 600 }))
          )
          assert.strictEqual(
            refused._tag === "TaskRefused" ? refused.code : refused._tag,
            "task_budget_exhausted"
          )
          assert.strictEqual(yield* a.budgets.settleStale(20 * 60_000), 0)
          yield* TestClock.adjust("21 minutes")
          // The instance's own sweep runs every minute of the test clock and may settle the hold before
          // this pass does; either way it is settled once a pass has run.
          yield* a.budgets.settleStale(20 * 60_000)
          // It was never funded (no receipt): the hold and the step go back.
          const after = yield* a.tasks.view(created.id, { token })
          assert.deepInclude(after, { held: 0, steps: 0, spent: 0, remaining: 1_000 })
          yield* a.stop
        })
      )
  )
})
