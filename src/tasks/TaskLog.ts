import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import type { TaskEvent } from "../domain/Tasks.ts"
import { TASK_EVENTS_CHANNEL, type TaskEvents } from "./TaskEvents.ts"
import { type EventRow, eventOf, MAX_EVENT_WAIT_MS } from "./TaskRows.ts"

/** A task's ordered event log (D138, D139): appends numbered under the task's row lock, and long polling. */
/** A read of the log: the events after `cursor`, at most `limit`, waiting up to `waitMs` for a first one. */
export interface EventQuery {
  readonly cursor: number
  readonly waitMs: number
  readonly limit: number
}

export interface TaskLog {
  /** Appends an event inside the caller's transaction and announces it to every instance's readers. */
  readonly record: (
    taskId: string,
    type: string,
    data: unknown,
    source?: "client" | "router"
  ) => Effect.Effect<TaskEvent>
  /**
   * The events after `cursor` (at most `limit`); when there are none yet, waits up to `waitMs` (bounded by
   * `MAX_EVENT_WAIT_MS`) for one to be appended, on this instance or another.
   */
  readonly poll: (taskId: string, query: EventQuery) => Effect.Effect<ReadonlyArray<TaskEvent>>
}

export const makeTaskLog = (sql: SqlClient.SqlClient, bus: TaskEvents["Service"]): TaskLog => {
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

  const read = (taskId: string, cursor: number, limit: number) =>
    Effect.map(
      sql<EventRow>`
        SELECT seq, type, source, data, created_at FROM task_events
        WHERE task_id = ${taskId} AND seq > ${cursor} ORDER BY seq LIMIT ${limit}
      `.pipe(Effect.orDie),
      (rows) => rows.map(eventOf)
    )

  const poll: TaskLog["poll"] = (taskId, query) => {
    const waitMs = Math.min(Math.max(query.waitMs, 0), MAX_EVENT_WAIT_MS)
    return Effect.scoped(
      Effect.gen(function* () {
        // Listen first, then read: an event committed in between still wakes this reader.
        const next = yield* bus.watch(taskId)
        const deadline = (yield* Clock.currentTimeMillis) + waitMs
        while (true) {
          const found = yield* read(taskId, query.cursor, query.limit)
          const now = yield* Clock.currentTimeMillis
          if (found.length > 0 || now >= deadline) return found
          yield* next(deadline - now)
        }
      })
    )
  }

  return { record, poll }
}
