import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"

/**
 * Erasure and the retention reaper (D135, D142): a task and what only it referenced go, on request or when
 * its retention runs out.
 */
export interface Retention {
  /** Erases a task and every record only it referenced; snapshots a fork still names stay. */
  readonly erase: (taskId: string) => Effect.Effect<void>
  /** Erases every task whose retention ran out (at most 500 a pass); returns how many. */
  readonly reap: Effect.Effect<number>
}

export const makeRetention = (sql: SqlClient.SqlClient): Retention => {
  const erase = (taskId: string) =>
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

  const reap = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const expired = yield* sql<{ task_id: string }>`
      SELECT task_id FROM tasks WHERE expires_at <= ${now} ORDER BY expires_at LIMIT 500
    `.pipe(Effect.orDie)
    yield* Effect.forEach(expired, (row) => erase(row.task_id), { discard: true })
    return expired.length
  }).pipe(Effect.withSpan("Tasks.reap"))

  return { erase, reap }
}
