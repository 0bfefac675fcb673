import { Cause, Clock, Context, Effect, Exit, Layer, Option } from "effect"
import { SqlClient } from "effect/sql"
import {
  type Forbidden,
  InvalidRequest,
  NotFound,
  type PaidCallError,
  type Unauthorized
} from "../domain/Errors.ts"
import type { ContextRecommendation, EvalRun } from "../domain/Evals.ts"
import { collect } from "../inference/Collect.ts"
import { LiveStreams } from "../inference/LiveStreams.ts"
import { Pipeline } from "../inference/Pipeline.ts"
import { Keys } from "../payment/Keys.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { Tasks } from "../tasks/Tasks.ts"
import { recommend } from "./ContextPolicy.ts"
import { type CaseOutcome, type EvalCase, SUITES } from "./Suites.ts"

/** A key as an evaluation endpoint receives it. */
export interface EvalCredentials {
  readonly apiKey?: string | undefined
  readonly creditKey?: string | undefined
}

interface RunRow {
  readonly run_id: string
  readonly key_id: string
  readonly wallet: string
  readonly suite: string
  readonly target: string
  readonly budget: string
  readonly spent: string
  readonly status: EvalRun["status"]
  readonly created_at: string
  readonly finished_at: string | null
}

const refusalOf = (cause: Cause.Cause<PaidCallError>): CaseOutcome => {
  const failure = Cause.findErrorOption(cause)
  if (Option.isNone(failure)) return { _tag: "Refused", code: "defect", status: "Defect" }
  const error = failure.value
  return {
    _tag: "Refused",
    code: ("code" in error ? error.code : undefined) ?? error._tag,
    status: error._tag
  }
}

const missingKey = () =>
  new InvalidRequest({
    code: "key_required",
    param: "x-credit-key",
    message: "Send the wallet's x-credit-key (or x-api-key to read)"
  })

/**
 * Evaluations (spec 4.3; D146–D149): the fixed harness regression suite, wallet-owned runs executed
 * through the router's own paid path within a budget, and offline context-policy tuning from redacted
 * task traces. A run is a task of its key (the run's id is the task's id): its budget and steps are
 * held like any task's, its calls are receipts of the key's wallet, its trace is the task's.
 */
export class Evals extends Context.Service<
  Evals,
  {
    readonly suites: ReadonlyArray<{ readonly id: string; readonly cases: ReadonlyArray<EvalCase> }>
    readonly start: (
      credentials: EvalCredentials,
      input: { readonly suite: string; readonly target: string; readonly budget: number }
    ) => Effect.Effect<EvalRun, Unauthorized | Forbidden | InvalidRequest | NotFound>
    readonly run: (
      id: string,
      credentials: EvalCredentials
    ) => Effect.Effect<EvalRun, Unauthorized | InvalidRequest | NotFound>
    readonly optimize: (
      credentials: EvalCredentials,
      taskIds: ReadonlyArray<string> | undefined
    ) => Effect.Effect<ContextRecommendation, Unauthorized | InvalidRequest>
  }
>()("router/evals/Evals") {
  static readonly layer = Layer.effect(
    Evals,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const keys = yield* Keys
      const tasks = yield* Tasks
      const pipeline = yield* Pipeline
      const live = yield* LiveStreams
      const { publicUrl } = yield* RouterConfig
      const scope = yield* Effect.scope

      const viewOf = (row: RunRow) =>
        Effect.gen(function* () {
          const results = yield* sql<{
            case_id: string
            dialect: string
            passed: boolean
            outcome: string
            request_id: string | null
            charged: string
            latency_ms: number
            detail: string
          }>`SELECT * FROM eval_results WHERE run_id = ${row.run_id}`.pipe(Effect.orDie)
          const order = (SUITES.get(row.suite) ?? []).map((c) => c.id)
          const cases = [...results]
            .sort((a, b) => order.indexOf(a.case_id) - order.indexOf(b.case_id))
            .map((r) => ({ ...r, charged: Number(r.charged) }))
          return {
            id: row.run_id,
            object: "eval.run",
            suite: row.suite,
            target: row.target,
            wallet: row.wallet,
            status: row.status,
            budget: Number(row.budget),
            spent: Number(row.spent),
            created_at: Number(row.created_at),
            finished_at: row.finished_at === null ? null : Number(row.finished_at),
            passed: cases.filter((c) => c.passed).length,
            failed: cases.filter((c) => !c.passed).length,
            cases
          } satisfies EvalRun
        })

      /** One case through the paid path, paid by the run's key and held on the run's task. */
      const runCase = (runId: string, secret: string, target: string, evalCase: EvalCase) =>
        Effect.gen(function* () {
          const started = yield* Clock.currentTimeMillis
          const admitted = yield* Effect.exit(
            pipeline.admit(evalCase.request(target), {
              dialect: evalCase.dialect,
              paymentHeader: undefined,
              creditKey: secret,
              taskId: runId,
              resourceUrl: `${publicUrl}/v1/evals/runs`,
              agent: { role: "worker", parentTask: runId, agentId: evalCase.id }
            })
          )
          const outcome: CaseOutcome = Exit.isSuccess(admitted)
            ? { _tag: "Served", collected: yield* collect(live, admitted.value) }
            : refusalOf(admitted.cause)
          const latency = (yield* Clock.currentTimeMillis) - started
          const why = evalCase.check(outcome)
          const charged = outcome._tag === "Served" ? (outcome.collected.summary?.charged ?? 0) : 0
          yield* sql`
            INSERT INTO eval_results (run_id, case_id, dialect, passed, outcome, request_id, charged, latency_ms, detail)
            VALUES (${runId}, ${evalCase.id}, ${evalCase.dialect}, ${why === null}, ${outcome._tag === "Served" ? "served" : outcome.code},
                    ${outcome._tag === "Served" ? outcome.collected.requestId : null}, ${charged}, ${latency},
                    ${why ?? evalCase.exercises})
            ON CONFLICT (run_id, case_id) DO NOTHING
          `.pipe(Effect.orDie)
          return charged
        })

      const execute = (runId: string, secret: string, target: string, cases: ReadonlyArray<EvalCase>) =>
        Effect.gen(function* () {
          let spent = 0
          for (const evalCase of cases) spent += yield* runCase(runId, secret, target, evalCase)
          const now = yield* Clock.currentTimeMillis
          yield* sql`
            UPDATE eval_runs SET status = 'completed', spent = ${spent}, finished_at = ${now} WHERE run_id = ${runId}
          `.pipe(Effect.orDie)
        }).pipe(
          Effect.catchCause((cause) =>
            Effect.gen(function* () {
              yield* Effect.logError("evaluation run failed", cause)
              const now = yield* Clock.currentTimeMillis
              yield* sql`UPDATE eval_runs SET status = 'failed', finished_at = ${now} WHERE run_id = ${runId}`.pipe(
                Effect.ignore
              )
            })
          ),
          Effect.withSpan("Evals.execute", { attributes: { run_id: runId } })
        )

      const start = Effect.fn("Evals.start")(function* (
        credentials: EvalCredentials,
        input: { readonly suite: string; readonly target: string; readonly budget: number }
      ) {
        const secret = credentials.creditKey ?? credentials.apiKey
        if (secret === undefined) return yield* missingKey()
        // An API key cannot spend: a run is paid, so it needs the wallet's credit key (D147).
        const key = yield* keys.resolveCreditKey(secret)
        const cases = SUITES.get(input.suite)
        if (cases === undefined) {
          return yield* new NotFound({
            code: "suite_not_found",
            message: `No evaluation suite ${input.suite}`
          })
        }
        const { task } = yield* tasks.create(
          {
            goal: `evaluation run of ${input.suite} against ${input.target}`,
            max_steps: cases.length,
            budget: input.budget
          },
          { creditKey: secret }
        )
        const now = yield* Clock.currentTimeMillis
        const [row] = yield* sql<RunRow>`
          INSERT INTO eval_runs (run_id, key_id, wallet, suite, target, budget, status, created_at)
          VALUES (${task.id}, ${key.keyId}, ${key.wallet}, ${input.suite}, ${input.target}, ${input.budget}, 'running', ${now})
          RETURNING *
        `.pipe(Effect.orDie)
        yield* Effect.forkIn(execute(task.id, secret, input.target, cases), scope)
        return yield* viewOf(row!)
      })

      /** Any key of the owning wallet reads a run; to anyone else it does not exist. */
      const run = Effect.fn("Evals.run")(function* (id: string, credentials: EvalCredentials) {
        const secret = credentials.apiKey ?? credentials.creditKey
        if (secret === undefined) return yield* missingKey()
        const key = yield* keys.resolveApiKey(secret)
        const [row] = yield* sql<RunRow>`SELECT * FROM eval_runs WHERE run_id = ${id}`.pipe(Effect.orDie)
        if (row === undefined || row.wallet !== key.wallet) {
          return yield* new NotFound({
            code: "run_not_found",
            message: `No evaluation run ${id} of this wallet`
          })
        }
        return yield* viewOf(row)
      })

      const optimize = Effect.fn("Evals.optimize")(function* (
        credentials: EvalCredentials,
        taskIds: ReadonlyArray<string> | undefined
      ) {
        const secret = credentials.apiKey ?? credentials.creditKey
        if (secret === undefined) return yield* missingKey()
        const key = yield* keys.resolveApiKey(secret)
        // Only token counts of settled calls are read: the redacted trace, never a prompt or reply.
        const owned = yield* sql<{ task_id: string }>`
          SELECT task_id FROM tasks WHERE owner_key_id = ${key.keyId}
          ${taskIds === undefined ? sql`` : sql`AND task_id IN ${sql.in(taskIds.length === 0 ? [""] : taskIds)}`}
        `.pipe(Effect.orDie)
        const calls = yield* sql<{ in_tokens: string; out_tokens: string }>`
          SELECT r.body->>'in_tokens' AS in_tokens, r.body->>'out_tokens' AS out_tokens
          FROM task_calls c JOIN tasks t ON t.task_id = c.task_id JOIN receipts r ON r.request_id = c.request_id
          WHERE t.owner_key_id = ${key.keyId} AND c.settled_at IS NOT NULL
            AND c.task_id IN ${sql.in(owned.length === 0 ? [""] : owned.map((o) => o.task_id))}
            AND r.body->>'status' <> 'released'
        `.pipe(Effect.orDie)
        return recommend(
          owned.length,
          calls.map((c) => ({ promptTokens: Number(c.in_tokens), completionTokens: Number(c.out_tokens) }))
        )
      })

      return Evals.of({
        suites: [...SUITES].map(([id, cases]) => ({ id, cases })),
        start,
        run,
        optimize
      })
    })
  )
}
