import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { Conflict, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import {
  Acceptance,
  AcceptanceFrozen,
  AppendEvent,
  Checkpoint,
  CheckpointRequest,
  Claimed,
  ClaimRequest,
  CreatedTask,
  CreateTaskRequest,
  EffectBegin,
  EffectBegun,
  EffectResolve,
  Erased,
  ForkRequest,
  OtlpTrace,
  SnapshotContents,
  SnapshotRequest,
  TaskEffect,
  TaskEvent,
  TaskEventPage,
  TaskView,
  Verdict,
  VerifyRequest,
  WorkspaceSnapshot
} from "../domain/Tasks.ts"
import { PaidCallErrors } from "./ChatApi.ts"
import { openAi } from "./ErrorWire.ts"

const id = { id: Schema.String }
const effect = {
  id: Schema.String,
  effectId: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128))
}
const snapshot = { id: Schema.String, snapshot: Schema.String }
/** A write that can meet a conflict (a stale fence, a lost or held lease, a frozen contract): a 409. */
const Fenced = [openAi(Unauthorized), openAi(Conflict), openAi(InvalidRequest)] as const
/** Completing or abandoning an effect: fenced, and 404 for an effect that never began. */
const Resolving = [...Fenced, openAi(NotFound)] as const

/**
 * Durable tasks (spec 4.3; docs/decisions.md D135–D145). `x-task-token` (or the key that created the
 * task, in `x-api-key` / `x-credit-key`) authorizes every endpoint but the create; a wrong or missing one
 * is 401 whether or not the task exists.
 */
export class TasksApi extends HttpApiGroup.make("tasks").add(
  HttpApiEndpoint.post("createTask", "/v1/tasks", {
    payload: CreateTaskRequest,
    success: CreatedTask,
    error: [openAi(InvalidRequest), openAi(Unauthorized)]
  }),
  HttpApiEndpoint.get("task", "/v1/tasks/:id", {
    params: id,
    success: TaskView,
    error: openAi(Unauthorized)
  }),
  HttpApiEndpoint.get("taskEvents", "/v1/tasks/:id/events", {
    params: id,
    query: {
      cursor: Schema.optional(
        Schema.NumberFromString.check(Schema.isInt(), Schema.isGreaterThanOrEqualTo(0))
      ),
      /** Seconds to wait for a first event (long polling), 0–30. */
      wait: Schema.optional(Schema.NumberFromString.check(Schema.isBetween({ minimum: 0, maximum: 30 }))),
      limit: Schema.optional(
        Schema.NumberFromString.check(Schema.isInt(), Schema.isBetween({ minimum: 1, maximum: 500 }))
      )
    },
    success: TaskEventPage,
    error: [openAi(Unauthorized), openAi(InvalidRequest)]
  }),
  HttpApiEndpoint.post("appendTaskEvent", "/v1/tasks/:id/events", {
    params: id,
    payload: AppendEvent,
    success: TaskEvent,
    error: [openAi(Unauthorized), openAi(InvalidRequest)]
  }),
  HttpApiEndpoint.post("claimTask", "/v1/tasks/:id/claim", {
    params: id,
    payload: ClaimRequest,
    success: Claimed,
    error: Fenced
  }),
  HttpApiEndpoint.post("checkpointTask", "/v1/tasks/:id/checkpoints", {
    params: id,
    payload: CheckpointRequest,
    success: Checkpoint,
    error: Fenced
  }),
  HttpApiEndpoint.post("beginEffect", "/v1/tasks/:id/effects/:effectId/begin", {
    params: effect,
    payload: EffectBegin,
    success: EffectBegun,
    error: Fenced
  }),
  HttpApiEndpoint.post("completeEffect", "/v1/tasks/:id/effects/:effectId/complete", {
    params: effect,
    payload: EffectResolve,
    success: TaskEffect,
    error: Resolving
  }),
  HttpApiEndpoint.post("abandonEffect", "/v1/tasks/:id/effects/:effectId/abandon", {
    params: effect,
    payload: EffectResolve,
    success: TaskEffect,
    error: Resolving
  }),
  HttpApiEndpoint.put("freezeAcceptance", "/v1/tasks/:id/acceptance", {
    params: id,
    payload: Acceptance,
    success: AcceptanceFrozen,
    error: Fenced
  }),
  HttpApiEndpoint.post("verifyTask", "/v1/tasks/:id/verify", {
    params: id,
    payload: VerifyRequest,
    success: Verdict,
    error: PaidCallErrors
  }),
  HttpApiEndpoint.post("storeSnapshot", "/v1/tasks/:id/workspace-snapshots", {
    params: id,
    payload: SnapshotRequest,
    success: WorkspaceSnapshot,
    error: [openAi(Unauthorized), openAi(InvalidRequest)]
  }),
  HttpApiEndpoint.get("readSnapshot", "/v1/tasks/:id/workspace-snapshots/:snapshot", {
    params: snapshot,
    success: SnapshotContents,
    error: [openAi(Unauthorized), openAi(NotFound)]
  }),
  HttpApiEndpoint.post("forkSnapshot", "/v1/tasks/:id/workspace-snapshots/:snapshot/fork", {
    params: snapshot,
    payload: ForkRequest,
    success: CreatedTask,
    error: [openAi(Unauthorized), openAi(NotFound), openAi(InvalidRequest)]
  }),
  HttpApiEndpoint.get("taskTrace", "/v1/tasks/:id/trace/otlp", {
    params: id,
    success: OtlpTrace,
    error: openAi(Unauthorized)
  }),
  HttpApiEndpoint.delete("deleteTask", "/v1/tasks/:id", {
    params: id,
    success: Erased,
    error: openAi(Unauthorized)
  })
) {}
