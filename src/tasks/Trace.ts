import { createHash } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import type { Unauthorized } from "../domain/Errors.ts"
import type { KeyValue, OtlpSpan, OtlpTrace } from "../domain/Tasks.ts"
import { type TaskCredentials, Tasks } from "./Tasks.ts"

/** What a task's trace is built from: identifiers, times, amounts and outcomes, never a payload. */
export interface TraceRecords {
  readonly taskId: string
  readonly createdAt: number
  readonly now: number
  readonly state: string
  readonly budget: number
  readonly spent: number
  readonly calls: ReadonlyArray<{
    readonly requestId: string
    readonly startedAt: number
    readonly settledAt: number | null
    readonly held: number
    readonly charged: number | null
    readonly providerId: string | null
    readonly modelClass: string | null
    readonly status: string | null
    readonly inTokens: number | null
    readonly outTokens: number | null
  }>
  readonly events: ReadonlyArray<{
    readonly seq: number
    readonly type: string
    readonly source: string
    readonly createdAt: number
  }>
  readonly effects: ReadonlyArray<{
    readonly effectId: string
    readonly state: string
    readonly fence: number
    readonly begunAt: number
    readonly resolvedAt: number | null
  }>
}

const hex = (text: string, chars: number) => createHash("sha256").update(text).digest("hex").slice(0, chars)
const nanos = (ms: number) => `${BigInt(ms) * 1_000_000n}`
const str = (key: string, value: string): KeyValue => ({ key, value: { stringValue: value } })
const int = (key: string, value: number): KeyValue => ({ key, value: { intValue: String(value) } })

/** The router's own spans: claims, checkpoints, verification and the task's lifecycle events. */
const TRACED_EVENTS = /^(task\.|checkpoint\.|acceptance\.|snapshot\.|verification\.)/

/**
 * A task's spans in OTLP/JSON (D145): one root span for the task, a span per paid call (from its hold
 * to its settlement, with the receipt's provider, class, tokens and charge), per effect (begun to
 * resolved) and per router event (claims, checkpoints, verification). Client event data, checkpoint
 * contents, prompts, replies, tokens and keys are not read, so they cannot appear. Pure.
 */
export const traceOf = (records: TraceRecords): OtlpTrace => {
  const traceId = hex(`trace:${records.taskId}`, 32)
  const rootId = hex(`root:${records.taskId}`, 16)
  const child = (
    key: string,
    name: string,
    start: number,
    end: number,
    attributes: ReadonlyArray<KeyValue>,
    error?: string
  ): OtlpSpan => ({
    traceId,
    spanId: hex(`${records.taskId}:${key}`, 16),
    parentSpanId: rootId,
    name,
    kind: 1,
    startTimeUnixNano: nanos(start),
    endTimeUnixNano: nanos(Math.max(start, end)),
    attributes: [...attributes],
    status: error === undefined ? { code: 0 } : { code: 2, message: error }
  })
  const spans: Array<OtlpSpan> = [
    {
      traceId,
      spanId: rootId,
      name: "task",
      kind: 1,
      startTimeUnixNano: nanos(records.createdAt),
      endTimeUnixNano: nanos(Math.max(records.createdAt, records.now)),
      attributes: [
        str("task.id", records.taskId),
        str("task.state", records.state),
        int("task.budget", records.budget),
        int("task.spent", records.spent)
      ],
      status: { code: 0 }
    },
    ...records.calls.map((call) =>
      child(
        `call:${call.requestId}`,
        "task.paid_call",
        call.startedAt,
        call.settledAt ?? records.now,
        [
          str("request.id", call.requestId),
          int("task.held", call.held),
          ...(call.charged === null ? [] : [int("request.charged", call.charged)]),
          ...(call.providerId === null ? [] : [str("provider.id", call.providerId)]),
          ...(call.modelClass === null ? [] : [str("model.class", call.modelClass)]),
          ...(call.status === null ? [] : [str("request.status", call.status)]),
          ...(call.inTokens === null ? [] : [int("tokens.in", call.inTokens)]),
          ...(call.outTokens === null ? [] : [int("tokens.out", call.outTokens)])
        ],
        call.status === "released" ? "released: nothing was served" : undefined
      )
    ),
    ...records.effects.map((effect) =>
      child(
        `effect:${effect.effectId}`,
        "task.effect",
        effect.begunAt,
        effect.resolvedAt ?? records.now,
        [
          str("effect.id", effect.effectId),
          str("effect.state", effect.state),
          int("task.fence", effect.fence)
        ],
        effect.state === "abandoned" ? "abandoned" : undefined
      )
    ),
    ...records.events
      .filter((e) => e.source === "router" && TRACED_EVENTS.test(e.type))
      .map((event) =>
        child(
          `event:${event.seq}`,
          event.type,
          event.createdAt,
          event.createdAt,
          [int("event.seq", event.seq)],
          event.type === "verification.failed" ? "verification failed" : undefined
        )
      )
  ]
  return {
    resourceSpans: [
      {
        resource: { attributes: [str("service.name", "svc-router")] },
        scopeSpans: [{ scope: { name: "svc.tasks", version: "1" }, spans }]
      }
    ]
  }
}

/** Reads a task's records for its trace (identifiers and numbers only) and builds it. */
export class TaskTraces extends Context.Service<
  TaskTraces,
  { readonly otlp: (id: string, credentials: TaskCredentials) => Effect.Effect<OtlpTrace, Unauthorized> }
>()("router/tasks/TaskTraces") {
  static readonly layer = Layer.effect(
    TaskTraces,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const tasks = yield* Tasks
      const otlp = Effect.fn("TaskTraces.otlp")(function* (id: string, credentials: TaskCredentials) {
        const task = yield* tasks.authorize(id, credentials)
        const calls = yield* sql<{
          request_id: string
          created_at: string
          settled_at: string | null
          held: string
          charged: string | null
          provider_id: string | null
          model_class: string | null
          status: string | null
          in_tokens: string | null
          out_tokens: string | null
        }>`
          SELECT c.request_id, c.created_at, c.settled_at, c.held, c.charged,
                 r.body->>'provider_id' AS provider_id, r.body->>'model_class' AS model_class,
                 r.body->>'status' AS status, r.body->>'in_tokens' AS in_tokens, r.body->>'out_tokens' AS out_tokens
          FROM task_calls c LEFT JOIN receipts r ON r.request_id = c.request_id
          WHERE c.task_id = ${id} ORDER BY c.created_at, c.request_id
        `.pipe(Effect.orDie)
        const events = yield* sql<{ seq: string; type: string; source: string; created_at: string }>`
          SELECT seq, type, source, created_at FROM task_events WHERE task_id = ${id} ORDER BY seq
        `.pipe(Effect.orDie)
        const effects = yield* sql<{
          effect_id: string
          state: string
          fence: string
          begun_at: string
          resolved_at: string | null
        }>`
          SELECT effect_id, state, fence, begun_at, resolved_at FROM task_effects WHERE task_id = ${id} ORDER BY begun_at, effect_id
        `.pipe(Effect.orDie)
        const maybe = (v: string | null) => (v === null ? null : Number(v))
        return traceOf({
          taskId: id,
          createdAt: Number(task.created_at),
          now: yield* Clock.currentTimeMillis,
          state: task.state,
          budget: Number(task.budget),
          spent: Number(task.spent),
          calls: calls.map((c) => ({
            requestId: c.request_id,
            startedAt: Number(c.created_at),
            settledAt: maybe(c.settled_at),
            held: Number(c.held),
            charged: maybe(c.charged),
            providerId: c.provider_id,
            modelClass: c.model_class,
            status: c.status,
            inTokens: maybe(c.in_tokens),
            outTokens: maybe(c.out_tokens)
          })),
          events: events.map((e) => ({
            seq: Number(e.seq),
            type: e.type,
            source: e.source,
            createdAt: Number(e.created_at)
          })),
          effects: effects.map((e) => ({
            effectId: e.effect_id,
            state: e.state,
            fence: Number(e.fence),
            begunAt: Number(e.begun_at),
            resolvedAt: maybe(e.resolved_at)
          }))
        })
      })
      return TaskTraces.of({ otlp })
    })
  )
}
