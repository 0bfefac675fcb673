import { Effect } from "effect"
import type { SqlClient } from "effect/sql"
import type { Unauthorized } from "../domain/Errors.ts"
import type { Keys } from "../payment/Keys.ts"
import { invalidTaskToken, taskTokenHash } from "../payment/TaskBudgets.ts"
import { traced } from "../Telemetry.ts"
import type { TaskCredentials, TaskRow } from "./TaskRows.ts"

/** A task's capability (D135): its `x-task-token`, or the governed key that created it. */
export interface TaskAccess {
  /** The key id of the credentials' governed key (it then owns what it creates); none for a bare token. */
  readonly ownerKeyOf: (credentials: TaskCredentials) => Effect.Effect<string | undefined, Unauthorized>
  /**
   * The task's row when the credentials open it; an unknown task, a wrong token and a key that does not
   * own it all answer the same 401.
   */
  readonly authorize: (id: string, credentials: TaskCredentials) => Effect.Effect<TaskRow, Unauthorized>
  readonly load: (id: string) => Effect.Effect<TaskRow | undefined>
}

export const makeTaskAccess = (sql: SqlClient.SqlClient, keys: Keys["Service"]): TaskAccess => {
  const ownerKeyOf = (credentials: TaskCredentials): Effect.Effect<string | undefined, Unauthorized> => {
    const secret = credentials.apiKey ?? credentials.creditKey
    return secret === undefined
      ? Effect.succeed(undefined)
      : Effect.map(keys.resolveApiKey(secret), (key) => key.keyId)
  }

  const load = (id: string) =>
    Effect.map(sql<TaskRow>`SELECT * FROM tasks WHERE task_id = ${id}`.pipe(Effect.orDie), (rows) => rows[0])

  const authorize = Effect.fnUntraced(function* (id: string, credentials: TaskCredentials) {
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
  }, traced("Tasks.authorize"))

  return { ownerKeyOf, authorize, load }
}
