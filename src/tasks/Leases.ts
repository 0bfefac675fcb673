import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { Conflict } from "../domain/Errors.ts"
import type { ClaimRequest, TaskLease } from "../domain/Tasks.ts"
import type { TaskLog } from "./TaskLog.ts"
import { newId, staleFence, type TaskRow } from "./TaskRows.ts"

/**
 * Worker leases with fencing numbers (D137): one live lease a task; every new claim raises the fence, and a
 * write made under an older fence, or after its lease expired, is refused.
 */
export interface Leases {
  /** Claims the task (a new lease and fence) or, given `lease_id`, renews the live lease it names. */
  readonly claim: (
    taskId: string,
    input: ClaimRequest
  ) => Effect.Effect<
    { readonly lease: TaskLease; readonly recovered: boolean; readonly renewed: boolean },
    Conflict
  >
  /** Checks `fence` is the live lease's, under the task's row lock (inside the caller's transaction). */
  readonly fenced: (taskId: string, fence: number) => Effect.Effect<void, Conflict>
}

export const makeLeases = (sql: SqlClient.SqlClient, log: TaskLog): Leases => {
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

  const claim: Leases["claim"] = (taskId, input) => {
    const leaseMs = (input.lease_seconds ?? 60) * 1000
    return sql
      .withTransaction(
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const [row] = yield* sql<TaskRow>`SELECT * FROM tasks WHERE task_id = ${taskId} FOR UPDATE`
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
            yield* sql`UPDATE tasks SET lease_expires_at = ${now + leaseMs} WHERE task_id = ${taskId}`
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
            WHERE task_id = ${taskId} RETURNING fence
          `
          const recovered = current.lease_id !== null
          const lease = {
            lease_id: leaseId,
            worker,
            fence: Number(fence!.fence),
            expires_at: now + leaseMs
          }
          yield* log.record(taskId, "task.claimed", {
            lease_id: leaseId,
            worker,
            fence: lease.fence,
            recovered
          })
          return { lease, recovered, renewed: false }
        })
      )
      .pipe(Effect.catchTag("SqlError", Effect.die))
  }

  return { claim, fenced }
}
