import { Schema } from "effect"

/** The durable-task wire (spec 4.3, 2.11; docs/decisions.md D135–D145): requests, views, events, traces. */

/** Spec 8: retention defaults to 7 days and may be set from 1 hour to 30 days. */
export const DEFAULT_RETENTION_HOURS = 7 * 24
export const MAX_RETENTION_HOURS = 30 * 24

const Int = (minimum: number, maximum: number) =>
  Schema.Int.check(Schema.isGreaterThanOrEqualTo(minimum), Schema.isLessThanOrEqualTo(maximum))
const Id = Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128))

/** Task states (D136): `pending` until first claimed, `running` once claimed, then a verdict's end. */
export const TaskState = Schema.Literals(["pending", "running", "succeeded", "failed"])
export type TaskState = typeof TaskState.Type

export const CreateTaskRequest = Schema.Struct({
  goal: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(4000)),
  max_steps: Int(1, 100_000),
  /** The aggregate budget of the task's paid calls, in base units. */
  budget: Int(0, 10 ** 15),
  retention_hours: Schema.optionalKey(Int(1, MAX_RETENTION_HOURS))
})
export type CreateTaskRequest = typeof CreateTaskRequest.Type

export const TaskLease = Schema.Struct({
  lease_id: Schema.String,
  worker: Schema.String,
  fence: Schema.Int,
  /** Unix milliseconds. */
  expires_at: Schema.Int
})
export type TaskLease = typeof TaskLease.Type

export const Checkpoint = Schema.Struct({
  checkpoint_no: Schema.Int,
  fence: Schema.Int,
  execution: Schema.Unknown,
  context: Schema.Unknown,
  created_at: Schema.Int
})
export type Checkpoint = typeof Checkpoint.Type

export const EffectState = Schema.Literals(["begun", "completed", "abandoned"])
export const TaskEffect = Schema.Struct({
  effect_id: Schema.String,
  state: EffectState,
  fence: Schema.Int,
  description: Schema.Unknown,
  result: Schema.Unknown,
  begun_at: Schema.Int,
  resolved_at: Schema.NullOr(Schema.Int)
})
export type TaskEffect = typeof TaskEffect.Type

/** An approval is a client event `approval.granted` / `approval.denied` naming what it decides (D139). */
export const Approval = Schema.Struct({
  approval_id: Schema.String,
  decision: Schema.Literals(["granted", "denied"]),
  seq: Schema.Int,
  created_at: Schema.Int
})

/** The deterministic criteria and the optional model-review rubric (D143); frozen once set. */
export const Acceptance = Schema.Struct({
  required_events: Schema.optionalKey(Schema.Array(Id)),
  effects_resolved: Schema.optionalKey(Schema.Boolean),
  budget_not_exceeded: Schema.optionalKey(Schema.Boolean),
  required_approvals: Schema.optionalKey(Schema.Array(Id)),
  required_artifacts: Schema.optionalKey(Schema.Array(Schema.String.check(Schema.isMaxLength(1024)))),
  output_schema: Schema.optionalKey(Schema.Unknown),
  rubric: Schema.optionalKey(
    Schema.Struct({
      instructions: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(8000)),
      model: Schema.optionalKey(Schema.String)
    })
  )
})
export type Acceptance = typeof Acceptance.Type

export const TaskView = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("task"),
  goal: Schema.String,
  state: TaskState,
  max_steps: Schema.Int,
  steps: Schema.Int,
  budget: Schema.Int,
  spent: Schema.Int,
  held: Schema.Int,
  remaining: Schema.Int,
  retention_hours: Schema.Int,
  created_at: Schema.Int,
  expires_at: Schema.Int,
  fence: Schema.Int,
  lease: Schema.NullOr(TaskLease),
  latest_checkpoint: Schema.NullOr(Checkpoint),
  approvals: Schema.Array(Approval),
  unresolved_effects: Schema.Array(TaskEffect),
  acceptance: Schema.NullOr(Acceptance),
  lineage: Schema.Struct({
    parent_task_id: Schema.NullOr(Schema.String),
    parent_snapshot_id: Schema.NullOr(Schema.String),
    forks: Schema.Array(Schema.Struct({ task_id: Schema.String, snapshot_id: Schema.String }))
  })
})
export type TaskView = typeof TaskView.Type

export const CreatedTask = Schema.Struct({
  task: TaskView,
  /** The capability: returned once, stored only as its SHA-256. */
  token: Schema.String,
  header: Schema.Literal("x-task-token")
})

export const TaskEvent = Schema.Struct({
  seq: Schema.Int,
  type: Schema.String,
  source: Schema.Literals(["client", "router"]),
  data: Schema.Unknown,
  created_at: Schema.Int
})
export type TaskEvent = typeof TaskEvent.Type

export const TaskEventPage = Schema.Struct({
  object: Schema.Literal("list"),
  data: Schema.Array(TaskEvent),
  /** Pass as `cursor` to read on: the last `seq` returned (the cursor given when none were). */
  next_cursor: Schema.Int
})

export const AppendEvent = Schema.Struct({
  type: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128)),
  data: Schema.optionalKey(Schema.Unknown)
})

export const ClaimRequest = Schema.Struct({
  worker: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128))),
  /** The caller's current lease: renews it (same fence) instead of claiming anew. */
  lease_id: Schema.optionalKey(Schema.String),
  lease_seconds: Schema.optionalKey(Int(5, 3600))
})

export const Claimed = Schema.Struct({
  lease: TaskLease,
  /** `true` when this claim took the task over from an expired lease. */
  recovered: Schema.Boolean,
  renewed: Schema.Boolean,
  latest_checkpoint: Schema.NullOr(Checkpoint),
  unresolved_effects: Schema.Array(TaskEffect)
})

export const CheckpointRequest = Schema.Struct({
  fence: Schema.Int,
  execution: Schema.Unknown,
  context: Schema.optionalKey(Schema.Unknown)
})

export const EffectBegin = Schema.Struct({
  fence: Schema.Int,
  description: Schema.optionalKey(Schema.Unknown)
})
export const EffectResolve = Schema.Struct({
  fence: Schema.Int,
  result: Schema.optionalKey(Schema.Unknown)
})

export const EffectBegun = Schema.Struct({
  effect: TaskEffect,
  /** `true` only for the call that recorded it: the worker may perform the effect. */
  proceed: Schema.Boolean
})

export const Erased = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("task"),
  deleted: Schema.Boolean
})
