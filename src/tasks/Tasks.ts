import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { repeatInBackground } from "../Background.ts"
import { Conflict, InvalidRequest, NotFound, type Unauthorized } from "../domain/Errors.ts"
import {
  type Checkpoint,
  type CreateTaskRequest,
  DEFAULT_RETENTION_HOURS,
  type TaskEffect,
  type TaskEvent,
  type TaskLease,
  type TaskView
} from "../domain/Tasks.ts"
import { Keys } from "../payment/Keys.ts"
import { invalidTaskToken, TaskBudgets, taskTokenHash } from "../payment/TaskBudgets.ts"
import { TASK_EVENTS_CHANNEL, TaskEvents } from "./TaskEvents.ts"
import {
  type CheckpointRow,
  checkpointOf,
  type EffectRow,
  type EventRow,
  effectOf,
  eventOf,
  MAX_EVENT_WAIT_MS,
  newId,
  type ROUTER_EVENTS,
  STALE_HOLD_MS,
  staleFence,
  type TaskCredentials,
  type TaskRow
} from "./TaskRows.ts"

export {
  effectOf,
  eventOf,
  MAX_EVENT_WAIT_MS,
  ROUTER_EVENTS,
  type TaskCredentials,
  type TaskRow
} from "./TaskRows.ts"

/**
 * Durable tasks (spec 4.3; docs/decisions.md D135–D141): the retained record, its capability,
 * the ordered event log with long polling across instances, worker leases with fencing numbers,
 * checkpoints, write-ahead effects, erasure and the retention reaper. Paid calls are held against
 * the task's budget on the paid path (`payment/TaskBudgets.ts`).
 */
export class Tasks extends Context.Service<
  Tasks,
  {
    readonly create: (
      input: CreateTaskRequest,
      owner: TaskCredentials,
      lineage?: { readonly parentTaskId: string; readonly parentSnapshotId: string }
    ) => Effect.Effect<{ readonly task: TaskView; readonly token: string }, Unauthorized>
    readonly authorize: (id: string, credentials: TaskCredentials) => Effect.Effect<TaskRow, Unauthorized>
    readonly view: (id: string, credentials: TaskCredentials) => Effect.Effect<TaskView, Unauthorized>
    readonly events: (
      id: string,
      credentials: TaskCredentials,
      query: { readonly cursor: number; readonly waitMs: number; readonly limit: number }
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
      input: { readonly worker?: string; readonly lease_id?: string; readonly lease_seconds?: number }
    ) => Effect.Effect<
      {
        readonly lease: TaskLease
        readonly recovered: boolean
        readonly renewed: boolean
        readonly latest_checkpoint: Checkpoint | null
        readonly unresolved_effects: ReadonlyArray<TaskEffect>
      },
      Unauthorized | Conflict
    >
    readonly checkpoint: (
      id: string,
      credentials: TaskCredentials,
      input: { readonly fence: number; readonly execution: unknown; readonly context?: unknown }
    ) => Effect.Effect<Checkpoint, Unauthorized | Conflict>
    readonly beginEffect: (
      id: string,
      effectId: string,
      credentials: TaskCredentials,
      input: { readonly fence: number; readonly description?: unknown }
    ) => Effect.Effect<{ readonly effect: TaskEffect; readonly proceed: boolean }, Unauthorized | Conflict>
    readonly resolveEffect: (
      id: string,
      effectId: string,
      credentials: TaskCredentials,
      outcome: "completed" | "abandoned",
      input: { readonly fence: number; readonly result?: unknown }
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
      const keys = yield* Keys
      const bus = yield* TaskEvents
      const budgets = yield* TaskBudgets

      const ownerKeyOf = (credentials: TaskCredentials): Effect.Effect<string | undefined, Unauthorized> => {
        const secret = credentials.apiKey ?? credentials.creditKey
        return secret === undefined
          ? Effect.succeed(undefined)
          : Effect.map(keys.resolveApiKey(secret), (key) => key.keyId)
      }

      const load = (id: string) =>
        Effect.map(
          sql<TaskRow>`SELECT * FROM tasks WHERE task_id = ${id}`.pipe(Effect.orDie),
          (rows) => rows[0]
        )

      // An unknown task, a wrong token and a key that does not own it all answer the same 401.
      const authorize = Effect.fn("Tasks.authorize")(function* (id: string, credentials: TaskCredentials) {
        if (credentials.token !== undefined) {
          const [row] = yield* sql<TaskRow>`
            SELECT * FROM tasks WHERE task_id = ${id} AND token_hash = ${taskTokenHash(credentials.token)}
          `.pipe(Effect.orDie)
          if (row !== undefined) return row
          return yield* invalidTaskToken()
        }
        const keyId = yield* ownerKeyOf(credentials).pipe(Effect.mapError(() => invalidTaskToken()))
        if (keyId === undefined) return yield* invalidTaskToken()
        const row = yield* load(id)
        if (row === undefined || row.owner_key_id !== keyId) return yield* invalidTaskToken()
        return row
      })

      const record = (taskId: string, type: string, data: unknown, source: "client" | "router" = "router") =>
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          // The task's row lock orders the appends: seq n+1 commits only after seq n did.
          const [row] = yield* sql<EventRow>`
            WITH t AS (UPDATE tasks SET last_seq = last_seq + 1 WHERE task_id = ${taskId} RETURNING last_seq)
            INSERT INTO task_events (task_id, seq, type, source, data, created_at)
            SELECT ${taskId}, last_seq, ${type}, ${source}, ${JSON.stringify(data ?? null)}::jsonb, ${now} FROM t
            RETURNING seq, type, source, data, created_at
          `
          yield* sql`SELECT pg_notify(${TASK_EVENTS_CHANNEL}, ${taskId})`
          return eventOf(row!)
        }).pipe(Effect.orDie)

      const latestCheckpoint = (taskId: string) =>
        Effect.map(
          sql<CheckpointRow>`
            SELECT * FROM task_checkpoints WHERE task_id = ${taskId} ORDER BY checkpoint_no DESC LIMIT 1
          `.pipe(Effect.orDie),
          (rows) => (rows[0] === undefined ? null : checkpointOf(rows[0]))
        )
      const unresolvedEffects = (taskId: string) =>
        Effect.map(
          sql<EffectRow>`
            SELECT * FROM task_effects WHERE task_id = ${taskId} AND state = 'begun' ORDER BY begun_at, effect_id
          `.pipe(Effect.orDie),
          (rows) => rows.map(effectOf)
        )

      const viewOf = (row: TaskRow) =>
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const approvals = yield* sql<{
            seq: string
            type: string
            approval_id: string
            created_at: string
          }>`
            SELECT seq, type, data->>'approval_id' AS approval_id, created_at FROM task_events
            WHERE task_id = ${row.task_id} AND source = 'client'
              AND type IN ('approval.granted', 'approval.denied') AND data ? 'approval_id'
            ORDER BY seq
          `.pipe(Effect.orDie)
          const forks = yield* sql<{ task_id: string; parent_snapshot_id: string }>`
            SELECT task_id, parent_snapshot_id FROM tasks WHERE parent_task_id = ${row.task_id} ORDER BY created_at
          `.pipe(Effect.orDie)
          const leaseLive = row.lease_id !== null && Number(row.lease_expires_at) > now
          const budget = Number(row.budget)
          const spent = Number(row.spent)
          const held = Number(row.held)
          return {
            id: row.task_id,
            object: "task",
            goal: row.goal,
            state: row.state,
            max_steps: row.max_steps,
            steps: row.steps,
            budget,
            spent,
            held,
            remaining: budget - spent - held,
            retention_hours: row.retention_hours,
            created_at: Number(row.created_at),
            expires_at: Number(row.expires_at),
            fence: Number(row.fence),
            lease: leaseLive
              ? {
                  lease_id: row.lease_id!,
                  worker: row.lease_worker ?? "",
                  fence: Number(row.fence),
                  expires_at: Number(row.lease_expires_at)
                }
              : null,
            latest_checkpoint: yield* latestCheckpoint(row.task_id),
            approvals: approvals.map((a) => ({
              approval_id: a.approval_id,
              decision: a.type === "approval.granted" ? ("granted" as const) : ("denied" as const),
              seq: Number(a.seq),
              created_at: Number(a.created_at)
            })),
            unresolved_effects: yield* unresolvedEffects(row.task_id),
            acceptance: row.acceptance,
            lineage: {
              parent_task_id: row.parent_task_id,
              parent_snapshot_id: row.parent_snapshot_id,
              forks: forks.map((f) => ({ task_id: f.task_id, snapshot_id: f.parent_snapshot_id }))
            }
          } satisfies TaskView
        })

      const create = Effect.fn("Tasks.create")(function* (
        input: CreateTaskRequest,
        owner: TaskCredentials,
        lineage?: { readonly parentTaskId: string; readonly parentSnapshotId: string }
      ) {
        const ownerKeyId = yield* ownerKeyOf(owner)
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
              yield* record(taskId, "task.created", {
                max_steps: input.max_steps,
                budget: input.budget,
                retention_hours: retentionHours,
                ...(lineage === undefined
                  ? {}
                  : { parent_task_id: lineage.parentTaskId, parent_snapshot_id: lineage.parentSnapshotId })
              })
              return (yield* load(taskId))!
            })
          )
          .pipe(Effect.orDie)
        return { task: yield* viewOf(row), token }
      })

      const view = Effect.fn("Tasks.view")(function* (id: string, credentials: TaskCredentials) {
        return yield* viewOf(yield* authorize(id, credentials))
      })

      const readEvents = (taskId: string, cursor: number, limit: number) =>
        Effect.map(
          sql<EventRow>`
            SELECT seq, type, source, data, created_at FROM task_events
            WHERE task_id = ${taskId} AND seq > ${cursor} ORDER BY seq LIMIT ${limit}
          `.pipe(Effect.orDie),
          (rows) => rows.map(eventOf)
        )

      const events = Effect.fn("Tasks.events")(function* (
        id: string,
        credentials: TaskCredentials,
        query: { readonly cursor: number; readonly waitMs: number; readonly limit: number }
      ) {
        yield* authorize(id, credentials)
        const waitMs = Math.min(Math.max(query.waitMs, 0), MAX_EVENT_WAIT_MS)
        return yield* Effect.scoped(
          Effect.gen(function* () {
            // Listen first, then read: an event committed in between still wakes this reader.
            const next = yield* bus.watch(id)
            const deadline = (yield* Clock.currentTimeMillis) + waitMs
            while (true) {
              const found = yield* readEvents(id, query.cursor, query.limit)
              const now = yield* Clock.currentTimeMillis
              if (found.length > 0 || now >= deadline) return found
              yield* next(deadline - now)
            }
          })
        )
      })

      const append = Effect.fn("Tasks.append")(function* (
        id: string,
        credentials: TaskCredentials,
        event: { readonly type: string; readonly data: unknown }
      ) {
        yield* authorize(id, credentials)
        return yield* sql.withTransaction(record(id, event.type, event.data, "client")).pipe(Effect.orDie)
      })

      const fenced = (taskId: string, fence: number) =>
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const [row] = yield* sql<{ fence: string; lease_expires_at: string | null }>`
            SELECT fence, lease_expires_at FROM tasks WHERE task_id = ${taskId} FOR UPDATE
          `.pipe(Effect.orDie)
          if (row === undefined || Number(row.fence) !== fence) return yield* staleFence(fence)
          if (row.lease_expires_at === null || Number(row.lease_expires_at) <= now) {
            return yield* new Conflict({
              code: "lease_expired",
              param: "fence",
              message: "the lease of this fence has expired; claim the task again"
            })
          }
        })

      const claim = Effect.fn("Tasks.claim")(function* (
        id: string,
        credentials: TaskCredentials,
        input: { readonly worker?: string; readonly lease_id?: string; readonly lease_seconds?: number }
      ) {
        yield* authorize(id, credentials)
        const leaseMs = (input.lease_seconds ?? 60) * 1000
        const outcome = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const now = yield* Clock.currentTimeMillis
              const [row] = yield* sql<TaskRow>`SELECT * FROM tasks WHERE task_id = ${id} FOR UPDATE`
              const current = row!
              const live = current.lease_id !== null && Number(current.lease_expires_at) > now
              if (input.lease_id !== undefined) {
                if (!live || current.lease_id !== input.lease_id) {
                  return yield* new Conflict({
                    code: "lease_lost",
                    param: "lease_id",
                    message: "this lease is no longer the task's; claim it anew"
                  })
                }
                yield* sql`UPDATE tasks SET lease_expires_at = ${now + leaseMs} WHERE task_id = ${id}`
                return {
                  lease: {
                    lease_id: current.lease_id,
                    worker: current.lease_worker ?? "",
                    fence: Number(current.fence),
                    expires_at: now + leaseMs
                  },
                  recovered: false,
                  renewed: true
                }
              }
              if (live) {
                return yield* new Conflict({
                  code: "lease_held",
                  message: `another worker holds this task's lease until ${current.lease_expires_at}`
                })
              }
              const leaseId = newId("lease_", 12)
              const worker = input.worker ?? leaseId
              const [fence] = yield* sql<{ fence: string }>`
                UPDATE tasks SET fence = fence + 1, lease_id = ${leaseId}, lease_worker = ${worker},
                  lease_expires_at = ${now + leaseMs},
                  state = CASE WHEN state = 'pending' THEN 'running' ELSE state END
                WHERE task_id = ${id} RETURNING fence
              `
              const recovered = current.lease_id !== null
              const lease = {
                lease_id: leaseId,
                worker,
                fence: Number(fence!.fence),
                expires_at: now + leaseMs
              }
              yield* record(id, "task.claimed", { lease_id: leaseId, worker, fence: lease.fence, recovered })
              return { lease, recovered, renewed: false }
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
        return {
          ...outcome,
          latest_checkpoint: yield* latestCheckpoint(id),
          unresolved_effects: yield* unresolvedEffects(id)
        }
      })

      const checkpoint = Effect.fn("Tasks.checkpoint")(function* (
        id: string,
        credentials: TaskCredentials,
        input: { readonly fence: number; readonly execution: unknown; readonly context?: unknown }
      ) {
        yield* authorize(id, credentials)
        return yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* fenced(id, input.fence)
              const now = yield* Clock.currentTimeMillis
              const [row] = yield* sql<CheckpointRow>`
                INSERT INTO task_checkpoints (task_id, checkpoint_no, fence, execution, context, created_at)
                SELECT ${id}, COALESCE(MAX(checkpoint_no), 0) + 1, ${input.fence},
                       ${JSON.stringify(input.execution ?? null)}::jsonb,
                       ${JSON.stringify(input.context ?? null)}::jsonb, ${now}
                FROM task_checkpoints WHERE task_id = ${id}
                RETURNING *
              `
              const saved = checkpointOf(row!)
              yield* record(id, "checkpoint.saved", {
                checkpoint_no: saved.checkpoint_no,
                fence: input.fence
              })
              return saved
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
      })

      const beginEffect = Effect.fn("Tasks.beginEffect")(function* (
        id: string,
        effectId: string,
        credentials: TaskCredentials,
        input: { readonly fence: number; readonly description?: unknown }
      ) {
        yield* authorize(id, credentials)
        return yield* sql
          .withTransaction(
            Effect.gen(function* () {
              // A repeat answers with the record whatever the fence: it grants no second go-ahead.
              const [existing] = yield* sql<EffectRow>`
                SELECT * FROM task_effects WHERE task_id = ${id} AND effect_id = ${effectId}
              `
              if (existing !== undefined) return { effect: effectOf(existing), proceed: false }
              yield* fenced(id, input.fence)
              const now = yield* Clock.currentTimeMillis
              const inserted = yield* sql<EffectRow>`
                INSERT INTO task_effects (task_id, effect_id, state, fence, description, begun_at)
                VALUES (${id}, ${effectId}, 'begun', ${input.fence},
                        ${JSON.stringify(input.description ?? null)}::jsonb, ${now})
                ON CONFLICT (task_id, effect_id) DO NOTHING
                RETURNING *
              `
              if (inserted[0] === undefined) {
                const [raced] = yield* sql<EffectRow>`
                  SELECT * FROM task_effects WHERE task_id = ${id} AND effect_id = ${effectId}
                `
                return { effect: effectOf(raced!), proceed: false }
              }
              yield* record(id, "effect.begun", { effect_id: effectId, fence: input.fence })
              return { effect: effectOf(inserted[0]), proceed: true }
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
      })

      const resolveEffect = Effect.fn("Tasks.resolveEffect")(function* (
        id: string,
        effectId: string,
        credentials: TaskCredentials,
        outcome: "completed" | "abandoned",
        input: { readonly fence: number; readonly result?: unknown }
      ) {
        yield* authorize(id, credentials)
        return yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* fenced(id, input.fence)
              const [existing] = yield* sql<EffectRow>`
                SELECT * FROM task_effects WHERE task_id = ${id} AND effect_id = ${effectId} FOR UPDATE
              `
              if (existing === undefined) {
                return yield* new NotFound({
                  code: "effect_not_found",
                  message: `No effect ${effectId} began on this task`
                })
              }
              if (existing.state === outcome) return effectOf(existing)
              if (existing.state !== "begun") {
                return yield* new Conflict({
                  code: "effect_resolved",
                  message: `effect ${effectId} is already ${existing.state}`
                })
              }
              const now = yield* Clock.currentTimeMillis
              const [row] = yield* sql<EffectRow>`
                UPDATE task_effects SET state = ${outcome}, resolved_at = ${now},
                  result = ${JSON.stringify(input.result ?? null)}::jsonb
                WHERE task_id = ${id} AND effect_id = ${effectId} RETURNING *
              `
              yield* record(id, outcome === "completed" ? "effect.completed" : "effect.abandoned", {
                effect_id: effectId,
                fence: input.fence
              })
              return effectOf(row!)
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
      })

      /** Erases a task and every record only it referenced; snapshots a fork still names stay. */
      const eraseTask = (taskId: string) =>
        sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`DELETE FROM tasks WHERE task_id = ${taskId}`
              // Its snapshots outlive it only while a fork names them; an unnamed one goes now.
              yield* sql`UPDATE workspace_snapshots SET task_id = NULL WHERE task_id = ${taskId}`
              yield* sql`
                DELETE FROM workspace_snapshots s WHERE s.task_id IS NULL
                  AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.parent_snapshot_id = s.snapshot_id)
              `
              yield* sql`
                DELETE FROM workspace_blobs b
                WHERE NOT EXISTS (SELECT 1 FROM workspace_files f WHERE f.hash = b.hash)
              `
            })
          )
          .pipe(Effect.orDie)

      const erase = Effect.fn("Tasks.erase")(function* (id: string, credentials: TaskCredentials) {
        yield* authorize(id, credentials)
        yield* eraseTask(id)
      })

      const reap = Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const expired = yield* sql<{ task_id: string }>`
          SELECT task_id FROM tasks WHERE expires_at <= ${now} ORDER BY expires_at LIMIT 500
        `.pipe(Effect.orDie)
        yield* Effect.forEach(expired, (row) => eraseTask(row.task_id), { discard: true })
        return expired.length
      }).pipe(Effect.withSpan("Tasks.reap"))

      yield* repeatInBackground(Effect.andThen(reap, budgets.settleStale(STALE_HOLD_MS)), {
        every: "1 minute",
        failure: "task retention reaper failed"
      })

      return Tasks.of({
        create,
        authorize,
        view,
        events,
        append,
        record: (taskId, type, data) => record(taskId, type, data),
        claim,
        checkpoint,
        beginEffect,
        resolveEffect,
        fenced,
        erase,
        reap
      })
    })
  )
}

export const invalidTask = (message: string, param?: string) =>
  new InvalidRequest({ code: "invalid_request", message, ...(param === undefined ? {} : { param }) })
