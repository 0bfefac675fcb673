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
export type ClaimRequest = typeof ClaimRequest.Type

export const Claimed = Schema.Struct({
  lease: TaskLease,
  /** `true` when this claim took the task over from an expired lease. */
  recovered: Schema.Boolean,
  renewed: Schema.Boolean,
  latest_checkpoint: Schema.NullOr(Checkpoint),
  unresolved_effects: Schema.Array(TaskEffect)
})
export type Claimed = typeof Claimed.Type

export const CheckpointRequest = Schema.Struct({
  fence: Schema.Int,
  execution: Schema.Unknown,
  context: Schema.optionalKey(Schema.Unknown)
})
export type CheckpointRequest = typeof CheckpointRequest.Type

export const EffectBegin = Schema.Struct({
  fence: Schema.Int,
  description: Schema.optionalKey(Schema.Unknown)
})
export type EffectBegin = typeof EffectBegin.Type
export const EffectResolve = Schema.Struct({
  fence: Schema.Int,
  result: Schema.optionalKey(Schema.Unknown)
})
export type EffectResolve = typeof EffectResolve.Type

export const EffectBegun = Schema.Struct({
  effect: TaskEffect,
  /** `true` only for the call that recorded it: the worker may perform the effect. */
  proceed: Schema.Boolean
})
export type EffectBegun = typeof EffectBegun.Type

export const Erased = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("task"),
  deleted: Schema.Boolean
})

export const AcceptanceFrozen = Schema.Struct({
  acceptance: Acceptance,
  /** Unix milliseconds: from then on the contract cannot change. */
  frozen_at: Schema.Int
})

export const VerifyRequest = Schema.Struct({
  /** The task's output, checked against the contract's `output_schema` and shown to a rubric review. */
  output: Schema.optionalKey(Schema.Unknown)
})

export const VerdictCheck = Schema.Struct({
  name: Schema.String,
  passed: Schema.Boolean,
  detail: Schema.String
})

export const Verdict = Schema.Struct({
  passed: Schema.Boolean,
  state: TaskState,
  checks: Schema.Array(VerdictCheck),
  /** The rubric review's paid call (the task paid for it), when the contract has a rubric. */
  review: Schema.NullOr(
    Schema.Struct({ request_id: Schema.NullOr(Schema.String), passed: Schema.Boolean, charged: Schema.Int })
  ),
  /** The router's `verification.passed` / `verification.failed` event that records the verdict. */
  event_seq: Schema.Int
})

const Path = Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(1024))

export const SnapshotRequest = Schema.Struct({
  files: Schema.Array(
    Schema.Struct({
      path: Path,
      /** UTF-8 text, or `content_base64` for bytes. */
      content: Schema.optionalKey(Schema.String),
      content_base64: Schema.optionalKey(Schema.String)
    })
  ).check(Schema.isMaxLength(5_000))
})

export const SnapshotFile = Schema.Struct({ path: Schema.String, hash: Schema.String, size: Schema.Int })

export const WorkspaceSnapshot = Schema.Struct({
  snapshot_id: Schema.String,
  task_id: Schema.NullOr(Schema.String),
  files: Schema.Array(SnapshotFile),
  /** Bytes this snapshot added to the store (content already stored under its hash is not stored again). */
  new_bytes: Schema.Int,
  created_at: Schema.Int
})

export const SnapshotContents = Schema.Struct({
  snapshot_id: Schema.String,
  task_id: Schema.NullOr(Schema.String),
  files: Schema.Array(
    Schema.Struct({
      path: Schema.String,
      hash: Schema.String,
      size: Schema.Int,
      content_base64: Schema.String
    })
  ),
  created_at: Schema.Int
})

export const ForkRequest = Schema.Struct({
  goal: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(4000))),
  max_steps: Schema.optionalKey(Int(1, 100_000)),
  budget: Schema.optionalKey(Int(0, 10 ** 15)),
  retention_hours: Schema.optionalKey(Int(1, MAX_RETENTION_HOURS))
})
export type ForkRequest = typeof ForkRequest.Type

/** OpenTelemetry's OTLP/JSON trace shape (`ExportTraceServiceRequest`), as much of it as a task's spans use. */
const AnyValue = Schema.Struct({
  stringValue: Schema.optionalKey(Schema.String),
  intValue: Schema.optionalKey(Schema.String),
  boolValue: Schema.optionalKey(Schema.Boolean)
})
export const KeyValue = Schema.Struct({ key: Schema.String, value: AnyValue })
export type KeyValue = typeof KeyValue.Type
export const OtlpSpan = Schema.Struct({
  traceId: Schema.String,
  spanId: Schema.String,
  parentSpanId: Schema.optionalKey(Schema.String),
  name: Schema.String,
  kind: Schema.Int,
  startTimeUnixNano: Schema.String,
  endTimeUnixNano: Schema.String,
  attributes: Schema.Array(KeyValue),
  status: Schema.Struct({ code: Schema.Int, message: Schema.optionalKey(Schema.String) })
})
export type OtlpSpan = typeof OtlpSpan.Type
export const OtlpTrace = Schema.Struct({
  resourceSpans: Schema.Array(
    Schema.Struct({
      resource: Schema.Struct({ attributes: Schema.Array(KeyValue) }),
      scopeSpans: Schema.Array(
        Schema.Struct({
          scope: Schema.Struct({ name: Schema.String, version: Schema.String }),
          spans: Schema.Array(OtlpSpan)
        })
      )
    })
  )
})
export type OtlpTrace = typeof OtlpTrace.Type
