import { randomBytes } from "node:crypto"
import { Conflict } from "../domain/Errors.ts"
import type { Acceptance, Checkpoint, TaskEffect, TaskEvent, TaskState } from "../domain/Tasks.ts"

/** A task's records as stored and as shown: the row shapes, their wire mappings and the task refusals they share. */
/** What a task endpoint was called with: `x-task-token`, or the owning governed key. */
export interface TaskCredentials {
  readonly token?: string | undefined
  readonly apiKey?: string | undefined
  readonly creditKey?: string | undefined
}

export interface TaskRow {
  readonly task_id: string
  readonly owner_key_id: string | null
  readonly goal: string
  readonly max_steps: number
  readonly budget: string
  readonly spent: string
  readonly held: string
  readonly retention_hours: number
  readonly state: TaskState
  readonly steps: number
  readonly last_seq: string
  readonly fence: string
  readonly lease_id: string | null
  readonly lease_worker: string | null
  readonly lease_expires_at: string | null
  readonly acceptance: Acceptance | null
  readonly acceptance_frozen_at: string | null
  readonly parent_task_id: string | null
  readonly parent_snapshot_id: string | null
  readonly created_at: string
  readonly expires_at: string
}

export interface EventRow {
  readonly seq: string
  readonly type: string
  readonly source: "client" | "router"
  readonly data: unknown
  readonly created_at: string
}
export interface CheckpointRow {
  readonly checkpoint_no: number
  readonly fence: string
  readonly execution: unknown
  readonly context: unknown
  readonly created_at: string
}
export interface EffectRow {
  readonly effect_id: string
  readonly state: TaskEffect["state"]
  readonly fence: string
  readonly description: unknown
  readonly result: unknown
  readonly begun_at: string
  readonly resolved_at: string | null
}

/** Event types the router writes; a client may append any type (D139), never as the router. */
export const ROUTER_EVENTS = [
  "task.created",
  "task.claimed",
  "checkpoint.saved",
  "effect.begun",
  "effect.completed",
  "effect.abandoned",
  "acceptance.frozen",
  "snapshot.stored",
  "task.forked",
  "verification.passed",
  "verification.failed"
] as const

/** Bounded long polling (D138): a reader waits at most this long for a first event. */
export const MAX_EVENT_WAIT_MS = 30_000
/** Holds a dead instance left are settled once no request can still be serving (15 min deadline). */
export const STALE_HOLD_MS = 20 * 60 * 1000

export const newId = (prefix: string, bytes: number) => `${prefix}${randomBytes(bytes).toString("hex")}`
export const int = (value: string | number | null) => (value === null ? null : Number(value))

export const eventOf = (row: EventRow): TaskEvent => ({
  seq: Number(row.seq),
  type: row.type,
  source: row.source,
  data: row.data,
  created_at: Number(row.created_at)
})
export const checkpointOf = (row: CheckpointRow): Checkpoint => ({
  checkpoint_no: row.checkpoint_no,
  fence: Number(row.fence),
  execution: row.execution,
  context: row.context,
  created_at: Number(row.created_at)
})
export const effectOf = (row: EffectRow): TaskEffect => ({
  effect_id: row.effect_id,
  state: row.state,
  fence: Number(row.fence),
  description: row.description,
  result: row.result,
  begun_at: Number(row.begun_at),
  resolved_at: int(row.resolved_at)
})

export const staleFence = (fence: number) =>
  new Conflict({
    code: "stale_fence",
    param: "fence",
    message: `fence ${fence} is not the task's current lease; another worker claimed it since`
  })
