import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import type { TaskView } from "../domain/Tasks.ts"
import type { Checkpoints } from "./Checkpoints.ts"
import type { TaskRow } from "./TaskRows.ts"

/**
 * What `GET /v1/tasks/:id` shows (D135): the row with its live lease, approvals, latest checkpoint, open
 * effects and lineage.
 */
export const makeTaskView =
  (sql: SqlClient.SqlClient, checkpoints: Checkpoints) =>
  (row: TaskRow): Effect.Effect<TaskView> =>
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
        latest_checkpoint: yield* checkpoints.latest(row.task_id),
        approvals: approvals.map((a) => ({
          approval_id: a.approval_id,
          decision: a.type === "approval.granted" ? ("granted" as const) : ("denied" as const),
          seq: Number(a.seq),
          created_at: Number(a.created_at)
        })),
        unresolved_effects: yield* checkpoints.unresolved(row.task_id),
        acceptance: row.acceptance,
        lineage: {
          parent_task_id: row.parent_task_id,
          parent_snapshot_id: row.parent_snapshot_id,
          forks: forks.map((f) => ({ task_id: f.task_id, snapshot_id: f.parent_snapshot_id }))
        }
      } satisfies TaskView
    })
