import { createHash } from "node:crypto"
import { Clock, Context, Effect, Layer, Schema, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import { Unauthorized } from "../domain/Errors.ts"
import { traced } from "../Telemetry.ts"

/** A task's paid call in flight: its worst case held on the task, the cap of what it may be charged. */
export interface TaskHold {
  readonly taskId: string
  readonly requestId: string
  readonly held: number
}

/** Why a task cannot take another paid call (rendered as a 402 by admission, before any provider work). */
export class TaskRefused extends Schema.TaggedError<TaskRefused>()("TaskRefused", {
  code: Schema.Literals(["task_budget_exhausted", "task_steps_exhausted", "task_closed"]),
  message: Schema.String
}) {}

export interface HoldInput {
  /** `x-task-token` as sent, or the task's id when the router itself pays a call for the task. */
  readonly task: { readonly token: string } | { readonly id: string }
  readonly requestId: string
  readonly worstCase: number
}

export const taskTokenHash = (token: string) => createHash("sha256").update(token, "utf8").digest("hex")

export const invalidTaskToken = () =>
  new Unauthorized({ code: "invalid_task_token", message: "Missing or invalid x-task-token for this task" })

/**
 * The task budget on the paid path (spec 4.3; docs/decisions.md D140). A paid call carrying
 * `x-task-token` first takes a hold of its worst case on the task in one conditional update (budget
 * minus spent minus held must cover it, and a step must be left), as a scoped resource of the request;
 * the hold closes after the request's capture or release, moving the receipt's charge from `held` to
 * `spent`. Concurrent calls therefore can never take the task past its budget, and `spent` is the sum
 * of the task's receipts. The columns are `tasks.spent`, `held`, `steps`; nothing else moves them.
 */
export class TaskBudgets extends Context.Service<
  TaskBudgets,
  {
    readonly hold: (input: HoldInput) => Effect.Effect<TaskHold, Unauthorized | TaskRefused, Scope.Scope>
    /** Settles a hold from its receipt (no receipt: nothing was charged). Idempotent. */
    readonly settle: (requestId: string) => Effect.Effect<void>
    /** Settles the holds a dead instance left, once no request can still be serving them. */
    readonly settleStale: (olderThanMs: number) => Effect.Effect<number>
  }
>()("router/payment/TaskBudgets") {
  static readonly layer = Layer.effect(
    TaskBudgets,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient

      const take = Effect.fnUntraced(function* (input: HoldInput) {
        const which =
          "token" in input.task
            ? sql`token_hash = ${taskTokenHash(input.task.token)}`
            : sql`task_id = ${input.task.id}`
        const now = yield* Clock.currentTimeMillis
        const taken = yield* sql<{ task_id: string }>`
          WITH t AS (
            UPDATE tasks SET held = held + ${input.worstCase}, steps = steps + 1
            WHERE ${which} AND state IN ('pending', 'running')
              AND spent + held + ${input.worstCase} <= budget AND steps < max_steps
            RETURNING task_id
          )
          INSERT INTO task_calls (request_id, task_id, held, created_at)
          SELECT ${input.requestId}, task_id, ${input.worstCase}, ${now} FROM t
          RETURNING task_id
        `.pipe(Effect.orDie)
        const row = taken[0]
        if (row !== undefined) {
          return { taskId: row.task_id, requestId: input.requestId, held: input.worstCase } satisfies TaskHold
        }
        const [task] = yield* sql<{
          state: string
          budget: string
          spent: string
          held: string
          steps: number
          max_steps: number
        }>`SELECT state, budget, spent, held, steps, max_steps FROM tasks WHERE ${which}`.pipe(Effect.orDie)
        if (task === undefined) return yield* invalidTaskToken()
        if (task.state !== "pending" && task.state !== "running") {
          return yield* new TaskRefused({
            code: "task_closed",
            message: `the task is ${task.state}; it takes no more paid calls`
          })
        }
        if (task.steps >= task.max_steps) {
          return yield* new TaskRefused({
            code: "task_steps_exhausted",
            message: `the task has used all ${task.max_steps} of its steps`
          })
        }
        const remaining = Number(task.budget) - Number(task.spent) - Number(task.held)
        return yield* new TaskRefused({
          code: "task_budget_exhausted",
          message: `the task has ${remaining} base units of its budget left (calls in flight held), less than this call's worst case ${input.worstCase}`
        })
      }, traced("TaskBudgets.hold"))

      const settle = (requestId: string) =>
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          // A call that was never funded (no receipt) was no step: its hold and its step go back. One
          // whose request is still `reserved` (its capture deferred to the background retry, D211) keeps
          // its hold until the request settles; the stale pass settles it then.
          yield* sql`
            WITH c AS (
              DELETE FROM task_calls WHERE request_id = ${requestId} AND settled_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM receipts WHERE request_id = ${requestId})
                AND NOT EXISTS (SELECT 1 FROM requests WHERE request_id = ${requestId} AND status = 'reserved')
              RETURNING task_id, held
            )
            UPDATE tasks t SET held = t.held - c.held, steps = t.steps - 1 FROM c WHERE t.task_id = c.task_id
          `
          yield* sql`
            WITH c AS (
              UPDATE task_calls SET settled_at = ${now},
                charged = (SELECT (body->>'charged')::bigint FROM receipts WHERE request_id = ${requestId})
              WHERE request_id = ${requestId} AND settled_at IS NULL
                AND EXISTS (SELECT 1 FROM receipts WHERE request_id = ${requestId})
              RETURNING task_id, held, charged
            )
            UPDATE tasks t SET held = t.held - c.held, spent = t.spent + c.charged FROM c WHERE t.task_id = c.task_id
          `
        }).pipe(
          sql.withTransaction,
          Effect.orDie,
          Effect.withSpan("TaskBudgets.settle", { attributes: { request_id: requestId } })
        )

      const hold = (input: HoldInput) =>
        Effect.acquireRelease(take(input), (taken) => settle(taken.requestId))

      const settleStale = (olderThanMs: number) =>
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const stale = yield* sql<{ request_id: string }>`
            SELECT request_id FROM task_calls WHERE settled_at IS NULL AND created_at < ${now - olderThanMs}
            LIMIT 500
          `.pipe(Effect.orDie)
          yield* Effect.forEach(stale, (row) => settle(row.request_id), { discard: true })
          return stale.length
        })

      return TaskBudgets.of({ hold, settle, settleStale })
    })
  )
}
