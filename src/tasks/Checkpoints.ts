import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { Conflict, NotFound } from "../domain/Errors.ts"
import type {
  Checkpoint,
  CheckpointRequest,
  EffectBegin,
  EffectBegun,
  EffectResolve,
  TaskEffect
} from "../domain/Tasks.ts"
import type { Leases } from "./Leases.ts"
import type { TaskLog } from "./TaskLog.ts"
import { type CheckpointRow, checkpointOf, type EffectRow, effectOf } from "./TaskRows.ts"

/**
 * What a worker leaves for its successor: numbered checkpoints, and write-ahead effects (D141), each begun
 * once (a repeat gets no second go-ahead) and resolved once. Every write is fenced by the writer's lease.
 */
export interface Checkpoints {
  readonly latest: (taskId: string) => Effect.Effect<Checkpoint | null>
  /** The effects begun and not yet completed or abandoned, oldest first. */
  readonly unresolved: (taskId: string) => Effect.Effect<ReadonlyArray<TaskEffect>>
  readonly save: (taskId: string, input: CheckpointRequest) => Effect.Effect<Checkpoint, Conflict>
  readonly beginEffect: (
    taskId: string,
    effectId: string,
    input: EffectBegin
  ) => Effect.Effect<EffectBegun, Conflict>
  readonly resolveEffect: (
    taskId: string,
    effectId: string,
    outcome: "completed" | "abandoned",
    input: EffectResolve
  ) => Effect.Effect<TaskEffect, Conflict | NotFound>
}

export const makeCheckpoints = (
  sql: SqlClient.SqlClient,
  log: TaskLog,
  fenced: Leases["fenced"]
): Checkpoints => {
  const latest = (taskId: string) =>
    Effect.map(
      sql<CheckpointRow>`
        SELECT * FROM task_checkpoints WHERE task_id = ${taskId} ORDER BY checkpoint_no DESC LIMIT 1
      `.pipe(Effect.orDie),
      (rows) => (rows[0] === undefined ? null : checkpointOf(rows[0]))
    )

  const unresolved = (taskId: string) =>
    Effect.map(
      sql<EffectRow>`
        SELECT * FROM task_effects WHERE task_id = ${taskId} AND state = 'begun' ORDER BY begun_at, effect_id
      `.pipe(Effect.orDie),
      (rows) => rows.map(effectOf)
    )

  const save: Checkpoints["save"] = (taskId, input) =>
    sql
      .withTransaction(
        Effect.gen(function* () {
          yield* fenced(taskId, input.fence)
          const now = yield* Clock.currentTimeMillis
          const [row] = yield* sql<CheckpointRow>`
            INSERT INTO task_checkpoints (task_id, checkpoint_no, fence, execution, context, created_at)
            SELECT ${taskId}, COALESCE(MAX(checkpoint_no), 0) + 1, ${input.fence},
                   ${JSON.stringify(input.execution ?? null)}::jsonb,
                   ${JSON.stringify(input.context ?? null)}::jsonb, ${now}
            FROM task_checkpoints WHERE task_id = ${taskId}
            RETURNING *
          `
          const saved = checkpointOf(row!)
          yield* log.record(taskId, "checkpoint.saved", {
            checkpoint_no: saved.checkpoint_no,
            fence: input.fence
          })
          return saved
        })
      )
      .pipe(Effect.catchTag("SqlError", Effect.die))

  const effectRow = (taskId: string, effectId: string) =>
    Effect.map(
      sql<EffectRow>`SELECT * FROM task_effects WHERE task_id = ${taskId} AND effect_id = ${effectId}`,
      (rows) => rows[0]
    )

  const beginEffect: Checkpoints["beginEffect"] = (taskId, effectId, input) =>
    sql
      .withTransaction(
        Effect.gen(function* () {
          // A repeat answers with the record whatever the fence: it grants no second go-ahead.
          const existing = yield* effectRow(taskId, effectId)
          if (existing !== undefined) return { effect: effectOf(existing), proceed: false }
          yield* fenced(taskId, input.fence)
          const now = yield* Clock.currentTimeMillis
          const inserted = yield* sql<EffectRow>`
            INSERT INTO task_effects (task_id, effect_id, state, fence, description, begun_at)
            VALUES (${taskId}, ${effectId}, 'begun', ${input.fence},
                    ${JSON.stringify(input.description ?? null)}::jsonb, ${now})
            ON CONFLICT (task_id, effect_id) DO NOTHING
            RETURNING *
          `
          if (inserted[0] === undefined) {
            const raced = yield* effectRow(taskId, effectId)
            return { effect: effectOf(raced!), proceed: false }
          }
          yield* log.record(taskId, "effect.begun", { effect_id: effectId, fence: input.fence })
          return { effect: effectOf(inserted[0]), proceed: true }
        })
      )
      .pipe(Effect.catchTag("SqlError", Effect.die))

  const resolveEffect: Checkpoints["resolveEffect"] = (taskId, effectId, outcome, input) =>
    sql
      .withTransaction(
        Effect.gen(function* () {
          yield* fenced(taskId, input.fence)
          const [existing] = yield* sql<EffectRow>`
            SELECT * FROM task_effects WHERE task_id = ${taskId} AND effect_id = ${effectId} FOR UPDATE
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
            WHERE task_id = ${taskId} AND effect_id = ${effectId} RETURNING *
          `
          yield* log.record(taskId, outcome === "completed" ? "effect.completed" : "effect.abandoned", {
            effect_id: effectId,
            fence: input.fence
          })
          return effectOf(row!)
        })
      )
      .pipe(Effect.catchTag("SqlError", Effect.die))

  return { latest, unresolved, save, beginEffect, resolveEffect }
}
