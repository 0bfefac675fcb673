import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { repeatInBackground } from "../Background.ts"
import type { Conflict, NotFound, Unauthorized } from "../domain/Errors.ts"
import {
  type Checkpoint,
  type CheckpointRequest,
  type Claimed,
  type ClaimRequest,
  type CreateTaskRequest,
  DEFAULT_RETENTION_HOURS,
  type EffectBegin,
  type EffectBegun,
  type EffectResolve,
  type TaskEffect,
  type TaskEvent,
  type TaskView
} from "../domain/Tasks.ts"
import { Keys } from "../payment/Keys.ts"
import { TaskBudgets, taskTokenHash } from "../payment/TaskBudgets.ts"
import { makeCheckpoints } from "./Checkpoints.ts"
import { makeLeases } from "./Leases.ts"
import { makeRetention } from "./Retention.ts"
import { makeTaskAccess } from "./TaskAccess.ts"
import { TaskEvents } from "./TaskEvents.ts"
import { type EventQuery, makeTaskLog } from "./TaskLog.ts"
import { newId, type ROUTER_EVENTS, STALE_HOLD_MS, type TaskCredentials, type TaskRow } from "./TaskRows.ts"
import { makeTaskView } from "./TaskViews.ts"

export { ROUTER_EVENTS, type TaskCredentials, type TaskRow } from "./TaskRows.ts"

/** Where a fork starts: the task it was forked from, and that task's snapshot. */
export interface TaskLineage {
  readonly parentTaskId: string
  readonly parentSnapshotId: string
}

/**
 * Durable tasks (spec 4.3; docs/decisions.md D135–D141): the retained record and its creation, composed
 * of its capability (`TaskAccess.ts`), the ordered event log with long polling across instances
 * (`TaskLog.ts`), worker leases with fencing numbers (`Leases.ts`), checkpoints and write-ahead effects
 * (`Checkpoints.ts`), the view (`TaskViews.ts`), erasure and the retention reaper (`Retention.ts`). Paid
 * calls are held against the task's budget on the paid path (`payment/TaskBudgets.ts`).
 */
export class Tasks extends Context.Service<
  Tasks,
  {
    readonly create: (
      input: CreateTaskRequest,
      owner: TaskCredentials,
      lineage?: TaskLineage
    ) => Effect.Effect<{ readonly task: TaskView; readonly token: string }, Unauthorized>
    readonly authorize: (id: string, credentials: TaskCredentials) => Effect.Effect<TaskRow, Unauthorized>
    readonly view: (id: string, credentials: TaskCredentials) => Effect.Effect<TaskView, Unauthorized>
    readonly events: (
      id: string,
      credentials: TaskCredentials,
      query: EventQuery
    ) => Effect.Effect<ReadonlyArray<TaskEvent>, Unauthorized>
    readonly append: (
      id: string,
      credentials: TaskCredentials,
      event: { readonly type: string; readonly data: unknown }
    ) => Effect.Effect<TaskEvent, Unauthorized>
    /** Appends a router-authored event inside the caller's transaction (and announces it). */
    readonly record: (
      taskId: string,
      type: (typeof ROUTER_EVENTS)[number],
      data: unknown
    ) => Effect.Effect<TaskEvent>
    readonly claim: (
      id: string,
      credentials: TaskCredentials,
      input: ClaimRequest
    ) => Effect.Effect<Claimed, Unauthorized | Conflict>
    readonly checkpoint: (
      id: string,
      credentials: TaskCredentials,
      input: CheckpointRequest
    ) => Effect.Effect<Checkpoint, Unauthorized | Conflict>
    readonly beginEffect: (
      id: string,
      effectId: string,
      credentials: TaskCredentials,
      input: EffectBegin
    ) => Effect.Effect<EffectBegun, Unauthorized | Conflict>
    readonly resolveEffect: (
      id: string,
      effectId: string,
      credentials: TaskCredentials,
      outcome: "completed" | "abandoned",
      input: EffectResolve
    ) => Effect.Effect<TaskEffect, Unauthorized | Conflict | NotFound>
    /** Checks `fence` is the live lease's, under the task's row lock (inside the caller's transaction). */
    readonly fenced: (taskId: string, fence: number) => Effect.Effect<void, Conflict>
    readonly erase: (id: string, credentials: TaskCredentials) => Effect.Effect<void, Unauthorized>
    /** Erases every task whose retention ran out; returns how many. */
    readonly reap: Effect.Effect<number>
  }
>()("router/tasks/Tasks") {
  static readonly layer = Layer.effect(
    Tasks,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const budgets = yield* TaskBudgets
      const access = makeTaskAccess(sql, yield* Keys)
      const log = makeTaskLog(sql, yield* TaskEvents)
      const leases = makeLeases(sql, log)
      const checkpoints = makeCheckpoints(sql, log, leases.fenced)
      const retention = makeRetention(sql)
      const viewOf = makeTaskView(sql, checkpoints)
      const { authorize } = access

      const create = Effect.fn("Tasks.create")(function* (
        input: CreateTaskRequest,
        owner: TaskCredentials,
        lineage?: TaskLineage
      ) {
        const ownerKeyId = yield* access.ownerKeyOf(owner)
        const taskId = newId("task_", 12)
        const token = `svc_tt_${randomBytes(32).toString("base64url")}`
        const now = yield* Clock.currentTimeMillis
        const retentionHours = input.retention_hours ?? DEFAULT_RETENTION_HOURS
        const row = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`
              INSERT INTO tasks (task_id, token_hash, owner_key_id, goal, max_steps, budget, retention_hours,
                                 state, parent_task_id, parent_snapshot_id, created_at, expires_at)
              VALUES (${taskId}, ${taskTokenHash(token)}, ${ownerKeyId ?? null}, ${input.goal}, ${input.max_steps},
                      ${input.budget}, ${retentionHours}, 'pending', ${lineage?.parentTaskId ?? null},
                      ${lineage?.parentSnapshotId ?? null}, ${now}, ${now + retentionHours * 3_600_000})
            `
              yield* log.record(taskId, "task.created", {
                max_steps: input.max_steps,
                budget: input.budget,
                retention_hours: retentionHours,
                ...(lineage === undefined
                  ? {}
                  : { parent_task_id: lineage.parentTaskId, parent_snapshot_id: lineage.parentSnapshotId })
              })
              return (yield* access.load(taskId))!
            })
          )
          .pipe(Effect.orDie)
        return { task: yield* viewOf(row), token }
      })

      const view = Effect.fn("Tasks.view")(function* (id: string, credentials: TaskCredentials) {
        return yield* viewOf(yield* authorize(id, credentials))
      })

      const events = Effect.fn("Tasks.events")(function* (
        id: string,
        credentials: TaskCredentials,
        query: EventQuery
      ) {
        yield* authorize(id, credentials)
        return yield* log.poll(id, query)
      })

      const append = Effect.fn("Tasks.append")(function* (
        id: string,
        credentials: TaskCredentials,
        event: { readonly type: string; readonly data: unknown }
      ) {
        yield* authorize(id, credentials)
        return yield* sql.withTransaction(log.record(id, event.type, event.data, "client")).pipe(Effect.orDie)
      })

      const claim = Effect.fn("Tasks.claim")(function* (
        id: string,
        credentials: TaskCredentials,
        input: ClaimRequest
      ) {
        yield* authorize(id, credentials)
        const outcome = yield* leases.claim(id, input)
        return {
          ...outcome,
          latest_checkpoint: yield* checkpoints.latest(id),
          unresolved_effects: yield* checkpoints.unresolved(id)
        }
      })

      const checkpoint = Effect.fn("Tasks.checkpoint")(function* (
        id: string,
        credentials: TaskCredentials,
        input: CheckpointRequest
      ) {
        yield* authorize(id, credentials)
        return yield* checkpoints.save(id, input)
      })

      const beginEffect = Effect.fn("Tasks.beginEffect")(function* (
        id: string,
        effectId: string,
        credentials: TaskCredentials,
        input: EffectBegin
      ) {
        yield* authorize(id, credentials)
        return yield* checkpoints.beginEffect(id, effectId, input)
      })

      const resolveEffect = Effect.fn("Tasks.resolveEffect")(function* (
        id: string,
        effectId: string,
        credentials: TaskCredentials,
        outcome: "completed" | "abandoned",
        input: EffectResolve
      ) {
        yield* authorize(id, credentials)
        return yield* checkpoints.resolveEffect(id, effectId, outcome, input)
      })

      const erase = Effect.fn("Tasks.erase")(function* (id: string, credentials: TaskCredentials) {
        yield* authorize(id, credentials)
        yield* retention.erase(id)
      })

      yield* repeatInBackground(Effect.andThen(retention.reap, budgets.settleStale(STALE_HOLD_MS)), {
        every: "1 minute",
        failure: "task retention reaper failed"
      })

      return Tasks.of({
        create,
        authorize,
        view,
        events,
        append,
        record: (taskId, type, data) => log.record(taskId, type, data),
        claim,
        checkpoint,
        beginEffect,
        resolveEffect,
        fenced: leases.fenced,
        erase,
        reap: retention.reap
      })
    })
  )
}
