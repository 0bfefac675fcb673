import { Effect } from "effect"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { type TaskCredentials, Tasks } from "../../tasks/Tasks.ts"
import { TaskTraces } from "../../tasks/Trace.ts"
import { Verification } from "../../tasks/Verification.ts"
import { Workspaces } from "../../tasks/Workspaces.ts"
import { Api } from "../Api.ts"

/** The task capability or the owning key, as sent. */
export const taskCredentialsOf = (request: HttpServerRequest): TaskCredentials => ({
  token: request.headers["x-task-token"],
  apiKey: request.headers["x-api-key"],
  creditKey: request.headers["x-credit-key"]
})

export const TasksHandlers = HttpApiBuilder.group(
  Api,
  "tasks",
  Effect.fn(function* (handlers) {
    const tasks = yield* Tasks
    const verification = yield* Verification
    const workspaces = yield* Workspaces
    const traces = yield* TaskTraces
    return handlers
      .handle("createTask", ({ payload, request }) =>
        Effect.map(tasks.create(payload, taskCredentialsOf(request)), ({ task, token }) => ({
          task,
          token,
          header: "x-task-token" as const
        }))
      )
      .handle("task", ({ params, request }) => tasks.view(params.id, taskCredentialsOf(request)))
      .handle("taskEvents", ({ params, query, request }) =>
        Effect.map(
          tasks.events(params.id, taskCredentialsOf(request), {
            cursor: query.cursor ?? 0,
            waitMs: Math.round((query.wait ?? 0) * 1000),
            limit: query.limit ?? 100
          }),
          (data) => ({
            object: "list" as const,
            data,
            next_cursor: data.length === 0 ? (query.cursor ?? 0) : data[data.length - 1]!.seq
          })
        )
      )
      .handle("appendTaskEvent", ({ params, payload, request }) =>
        tasks.append(params.id, taskCredentialsOf(request), {
          type: payload.type,
          data: payload.data ?? null
        })
      )
      .handle("claimTask", ({ params, payload, request }) =>
        tasks.claim(params.id, taskCredentialsOf(request), payload)
      )
      .handle("checkpointTask", ({ params, payload, request }) =>
        tasks.checkpoint(params.id, taskCredentialsOf(request), payload)
      )
      .handle("beginEffect", ({ params, payload, request }) =>
        tasks.beginEffect(params.id, params.effectId, taskCredentialsOf(request), payload)
      )
      .handle("completeEffect", ({ params, payload, request }) =>
        tasks.resolveEffect(params.id, params.effectId, taskCredentialsOf(request), "completed", payload)
      )
      .handle("abandonEffect", ({ params, payload, request }) =>
        tasks.resolveEffect(params.id, params.effectId, taskCredentialsOf(request), "abandoned", payload)
      )
      .handle("freezeAcceptance", ({ params, payload, request }) =>
        verification.freeze(params.id, taskCredentialsOf(request), payload)
      )
      .handle("verifyTask", ({ params, payload, request }) =>
        verification.verify(params.id, taskCredentialsOf(request), payload, {
          creditKey: request.headers["x-credit-key"],
          paymentHeader: request.headers["payment-signature"] ?? request.headers["x-payment"]
        })
      )
      .handle("storeSnapshot", ({ params, payload, request }) =>
        workspaces.store(params.id, taskCredentialsOf(request), payload.files)
      )
      .handle("readSnapshot", ({ params, request }) =>
        workspaces.read(params.id, params.snapshot, taskCredentialsOf(request))
      )
      .handle("forkSnapshot", ({ params, payload, request }) =>
        Effect.map(
          workspaces.fork(params.id, params.snapshot, taskCredentialsOf(request), payload),
          ({ task, token }) => ({ task, token, header: "x-task-token" as const })
        )
      )
      .handle("taskTrace", ({ params, request }) => traces.otlp(params.id, taskCredentialsOf(request)))
      .handle("deleteTask", ({ params, request }) =>
        Effect.as(tasks.erase(params.id, taskCredentialsOf(request)), {
          id: params.id,
          object: "task" as const,
          deleted: true
        })
      )
  })
)
