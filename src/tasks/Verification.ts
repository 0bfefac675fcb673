import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import type { ChatCompletionRequest } from "../domain/Chat.ts"
import { Conflict, InvalidRequest, type PaidCallError, type Unauthorized } from "../domain/Errors.ts"
import type { Acceptance, TaskState } from "../domain/Tasks.ts"
import { collect } from "../inference/Collect.ts"
import { LiveStreams } from "../inference/LiveStreams.ts"
import { Pipeline } from "../inference/Pipeline.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { type Check, grade } from "./Acceptance.ts"
import { unsupported } from "./JsonSchema.ts"
import { type TaskCredentials, Tasks } from "./Tasks.ts"
import { Workspaces } from "./Workspaces.ts"

/** How the caller pays for a rubric review: the task's budget holds it, this payment funds it. */
export interface ReviewPayment {
  readonly creditKey?: string | undefined
  readonly paymentHeader?: string | undefined
}

export interface VerdictRecord {
  readonly passed: boolean
  readonly state: TaskState
  readonly checks: ReadonlyArray<Check>
  readonly review: {
    readonly request_id: string | null
    readonly passed: boolean
    readonly charged: number
  } | null
  readonly event_seq: number
}

const REVIEW_INSTRUCTIONS =
  "You review the output of an automated task against a rubric. Judge only by the rubric. " +
  'Answer with a JSON object {"verdict": "pass" or "fail", "reason": one sentence}.'

/** The review's reply must be this JSON: strict output, so any model answers in the same form. */
const REVIEW_FORMAT = {
  type: "json_schema",
  json_schema: {
    name: "task_review",
    strict: true,
    schema: {
      type: "object",
      properties: { verdict: { type: "string", enum: ["pass", "fail"] }, reason: { type: "string" } },
      required: ["verdict", "reason"],
      additionalProperties: false
    }
  }
}

/** JSON with object keys sorted (JSONB does not keep the order a contract was written in). */
const canonical = (value: unknown): string =>
  JSON.stringify(value, (_key, v: unknown) =>
    typeof v === "object" && v !== null && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : 1)))
      : v
  )

const reviewVerdict = (text: string) => {
  try {
    const parsed = JSON.parse(text) as { verdict?: unknown }
    return parsed.verdict === "pass"
  } catch {
    return false
  }
}

/**
 * Acceptance and verification (spec 4.3, 6; D143, D144): a contract frozen once, a verdict graded on the
 * task's own records (events, effects, budget, approvals, artifacts) and the submitted output, a rubric
 * review made through the router's paid path for the task (held on its budget, paid by the caller's
 * payment), recorded as the router's `verification.passed` or `verification.failed` event.
 */
export class Verification extends Context.Service<
  Verification,
  {
    readonly freeze: (
      id: string,
      credentials: TaskCredentials,
      acceptance: Acceptance
    ) => Effect.Effect<
      { readonly acceptance: Acceptance; readonly frozen_at: number },
      Unauthorized | Conflict | InvalidRequest
    >
    readonly verify: (
      id: string,
      credentials: TaskCredentials,
      input: { readonly output?: unknown },
      payment: ReviewPayment
    ) => Effect.Effect<VerdictRecord, PaidCallError>
  }
>()("router/tasks/Verification") {
  static readonly layer = Layer.effect(
    Verification,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const tasks = yield* Tasks
      const workspaces = yield* Workspaces
      const pipeline = yield* Pipeline
      const live = yield* LiveStreams
      const { publicUrl } = yield* RouterConfig

      const freeze = Effect.fn("Verification.freeze")(function* (
        id: string,
        credentials: TaskCredentials,
        acceptance: Acceptance
      ) {
        yield* tasks.authorize(id, credentials)
        if (acceptance.output_schema !== undefined) {
          const problems = unsupported(acceptance.output_schema)
          if (problems.length > 0) {
            return yield* new InvalidRequest({
              code: "unsupported_schema",
              param: "output_schema",
              message: `output_schema is outside the supported subset: ${problems.slice(0, 5).join("; ")}`
            })
          }
        }
        const now = yield* Clock.currentTimeMillis
        return yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const [row] = yield* sql<{
                acceptance: Acceptance | null
                acceptance_frozen_at: string | null
              }>`
                SELECT acceptance, acceptance_frozen_at FROM tasks WHERE task_id = ${id} FOR UPDATE
              `
              if (row!.acceptance_frozen_at !== null) {
                // The same contract again is answered as it stands; any other is refused.
                if (canonical(row!.acceptance) === canonical(acceptance)) {
                  return { acceptance: row!.acceptance!, frozen_at: Number(row!.acceptance_frozen_at) }
                }
                return yield* new Conflict({
                  code: "acceptance_frozen",
                  message: "the acceptance contract is frozen and cannot change"
                })
              }
              yield* sql`
                UPDATE tasks SET acceptance = ${JSON.stringify(acceptance)}::jsonb, acceptance_frozen_at = ${now}
                WHERE task_id = ${id}
              `
              yield* tasks.record(id, "acceptance.frozen", { criteria: Object.keys(acceptance).sort() })
              return { acceptance, frozen_at: now }
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
      })

      const review = (
        taskId: string,
        goal: string,
        rubric: NonNullable<Acceptance["rubric"]>,
        output: unknown,
        payment: ReviewPayment
      ) =>
        Effect.gen(function* () {
          const request: ChatCompletionRequest = {
            model: rubric.model ?? "auto",
            messages: [
              { role: "system", content: REVIEW_INSTRUCTIONS },
              {
                role: "user",
                content: `Rubric:\n${rubric.instructions}\n\nTask goal:\n${goal}\n\nOutput:\n${JSON.stringify(output ?? null)}`
              }
            ],
            max_tokens: 256,
            response_format: REVIEW_FORMAT
          }
          const admitted = yield* pipeline.admit(request, {
            dialect: "openai",
            paymentHeader: payment.paymentHeader,
            creditKey: payment.creditKey,
            taskId,
            resourceUrl: `${publicUrl}/v1/tasks/${taskId}/verify`,
            agent: { role: "reviewer", parentTask: taskId }
          })
          const done = yield* collect(live, admitted)
          const passed = done.summary?.status === "ok" && reviewVerdict(done.text)
          return { request_id: done.requestId, passed, charged: done.summary?.charged ?? 0 }
        })

      const verify = Effect.fn("Verification.verify")(function* (
        id: string,
        credentials: TaskCredentials,
        input: { readonly output?: unknown },
        payment: ReviewPayment
      ) {
        const task = yield* tasks.authorize(id, credentials)
        const reviewed =
          task.acceptance?.rubric === undefined
            ? null
            : yield* review(id, task.goal, task.acceptance.rubric, input.output, payment)
        // Graded after the review, so its spend counts against the budget check.
        const row = yield* tasks.authorize(id, credentials)
        const events = yield* sql<{ type: string; source: "client" | "router"; approval_id: string | null }>`
          SELECT type, source, data->>'approval_id' AS approval_id FROM task_events WHERE task_id = ${id} ORDER BY seq
        `.pipe(Effect.orDie)
        const unresolved = yield* sql<{ effect_id: string }>`
          SELECT effect_id FROM task_effects WHERE task_id = ${id} AND state = 'begun' ORDER BY effect_id
        `.pipe(Effect.orDie)
        const approvals = new Map<string, "granted" | "denied">()
        for (const e of events) {
          if (e.source === "client" && e.approval_id !== null && e.type === "approval.granted")
            approvals.set(e.approval_id, "granted")
          if (e.source === "client" && e.approval_id !== null && e.type === "approval.denied")
            approvals.set(e.approval_id, "denied")
        }
        const checks: Array<Check> = [
          ...grade(row.acceptance, {
            events,
            unresolvedEffects: unresolved.map((u) => u.effect_id),
            budget: Number(row.budget),
            spent: Number(row.spent),
            held: Number(row.held),
            steps: row.steps,
            maxSteps: row.max_steps,
            approvals,
            artifacts: yield* workspaces.latestPaths(id),
            output: input.output
          })
        ]
        if (reviewed !== null) {
          checks.push({
            name: "rubric_review",
            passed: reviewed.passed,
            detail: `reviewed by paid call ${reviewed.request_id} (charged ${reviewed.charged} to the task)`
          })
        }
        const passed = checks.every((c) => c.passed)
        // Only a task with a contract reaches an end state; without one the verdict is advisory.
        const state: TaskState = row.acceptance === null ? row.state : passed ? "succeeded" : "failed"
        const event = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`UPDATE tasks SET state = ${state} WHERE task_id = ${id}`
              return yield* tasks.record(id, passed ? "verification.passed" : "verification.failed", {
                checks: checks.map((c) => ({ name: c.name, passed: c.passed })),
                ...(reviewed === null ? {} : { review_request_id: reviewed.request_id })
              })
            })
          )
          .pipe(Effect.orDie)
        return { passed, state, checks, review: reviewed, event_seq: event.seq } satisfies VerdictRecord
      })

      return Verification.of({ freeze, verify })
    })
  )
}
