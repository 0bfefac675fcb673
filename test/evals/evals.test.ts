import { assert, describe, layer } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { EvalRun } from "../../src/domain/Evals.ts"
import { adaptersRouter, OPENAI_CLASS, providerRequests, waitFor, waitForBook } from "../adapters/support.ts"
import { fundedKey } from "../support/Keys.ts"
import { call, postJson } from "../support/Router.ts"

interface Run {
  readonly id: string
  readonly status: string
  readonly budget: number
  readonly spent: number
  readonly passed: number
  readonly cases: ReadonlyArray<{
    readonly case_id: string
    readonly dialect: string
    readonly passed: boolean
    readonly outcome: string
    readonly request_id: string | null
    readonly charged: number
    readonly latency_ms: number
    readonly detail: string
  }>
}

const finished = (id: string, headers: Record<string, string>) =>
  waitFor(
    `evaluation run ${id}`,
    Effect.map(call(`/v1/evals/runs/${id}`, { headers }), (r) => {
      const run = r.json as Run
      return r.status === 200 && run.status !== "running" ? run : undefined
    }),
    120_000
  )

const taskSpend = (taskId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [row] = yield* sql<{ spent: string; held: string; receipts: string }>`
      SELECT t.spent::text AS spent, t.held::text AS held,
        (SELECT COALESCE(SUM((r.body->>'charged')::bigint), 0) FROM task_calls c JOIN receipts r ON r.request_id = c.request_id
         WHERE c.task_id = t.task_id)::text AS receipts
      FROM tasks t WHERE t.task_id = ${taskId}
    `
    return { spent: Number(row!.spent), held: Number(row!.held), receipts: Number(row!.receipts) }
  }).pipe(Effect.orDie)

describe("evaluations (spec 4.3)", () => {
  layer(adaptersRouter, { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.effect(
      "the fixed harness regression suite covers the three dialects and the hosted-tool refusal",
      () =>
        Effect.gen(function* () {
          const reply = yield* call("/v1/evals/suites")
          assert.strictEqual(reply.status, 200)
          const suite = (
            reply.json as { data: Array<{ id: string; cases: Array<{ id: string; dialect: string }> }> }
          ).data[0]!
          assert.strictEqual(suite.id, "harness-regression-v1")
          assert.deepStrictEqual(
            suite.cases.map((c) => c.id),
            ["plain-text", "streaming", "tool-call", "strict-json", "long-context", "hosted-computer-tool"]
          )
          assert.deepStrictEqual([...new Set(suite.cases.map((c) => c.dialect))].sort(), [
            "anthropic",
            "openai",
            "responses"
          ])
        })
    )

    it.effect(
      "a run is executed through the paid path within its budget; results, cost and latency are readable",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
          const headers = { "x-credit-key": key.secret }
          const created = yield* postJson(
            "/v1/evals/runs",
            { suite: "harness-regression-v1", target: OPENAI_CLASS, budget: 50_000_000 },
            headers
          )
          assert.strictEqual(created.status, 200, created.text)
          const run = yield* finished((created.json as Run).id, headers)
          Schema.decodeUnknownSync(EvalRun)(run)
          assert.strictEqual(run.status, "completed")
          assert.strictEqual(run.cases.length, 6)
          for (const c of run.cases) assert.isTrue(c.passed, `${c.case_id}: ${c.detail}`)
          const refusal = run.cases.find((c) => c.case_id === "hosted-computer-tool")!
          assert.deepInclude(refusal, { charged: 0, request_id: null })
          for (const c of run.cases.filter((c) => c.case_id !== "hosted-computer-tool")) {
            assert.match(c.request_id!, /^req_/)
            assert.isAbove(c.charged, 0)
            assert.isAtLeast(c.latency_ms, 0)
            const receipt = yield* call(`/v1/receipts/${c.request_id}`)
            assert.strictEqual((receipt.json as { receipt: { charged: number } }).receipt.charged, c.charged)
          }
          // The run is a task of its key: its spend is the sum of the run's receipts, within its budget.
          const total = run.cases.reduce((sum, c) => sum + c.charged, 0)
          assert.strictEqual(run.spent, total)
          assert.isAtMost(run.spent, run.budget)
          assert.deepStrictEqual(yield* taskSpend(run.id), { spent: total, held: 0, receipts: total })

          // Another wallet's key does not see it; an API key cannot start one.
          const stranger = yield* fundedKey({ budget: 1_000, balance: 1_000 })
          const hidden = yield* call(`/v1/evals/runs/${run.id}`, {
            headers: { "x-credit-key": stranger.secret }
          })
          assert.strictEqual(hidden.status, 404)
        })
    )

    it.effect("a run whose budget cannot cover a case refuses it before any provider work", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
        const headers = { "x-credit-key": key.secret }
        const before = yield* providerRequests
        const created = yield* postJson(
          "/v1/evals/runs",
          { suite: "harness-regression-v1", target: OPENAI_CLASS, budget: 1 },
          headers
        )
        const run = yield* finished((created.json as Run).id, headers)
        assert.strictEqual(yield* providerRequests, before)
        assert.strictEqual(run.spent, 0)
        for (const c of run.cases.filter((c) => c.case_id !== "hosted-computer-tool")) {
          assert.deepInclude(c, {
            passed: false,
            outcome: "task_budget_exhausted",
            request_id: null,
            charged: 0
          })
        }
      })
    )

    it.effect("an API key cannot start a run (it cannot spend); an unknown suite is 404", () =>
      Effect.gen(function* () {
        const key = yield* fundedKey({ budget: 1_000, balance: 1_000 })
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE api_keys SET kind = 'api' WHERE key_id = ${key.keyId}`.pipe(Effect.orDie)
        const refused = yield* postJson(
          "/v1/evals/runs",
          { suite: "harness-regression-v1", target: OPENAI_CLASS, budget: 100 },
          { "x-api-key": key.secret }
        )
        assert.strictEqual(refused.status, 403)
        const credit = yield* fundedKey({ budget: 1_000, balance: 1_000 })
        const unknown = yield* postJson(
          "/v1/evals/runs",
          { suite: "nope", target: OPENAI_CLASS, budget: 100 },
          {
            "x-credit-key": credit.secret
          }
        )
        assert.strictEqual(unknown.status, 404)
      })
    )

    it.effect(
      "context optimization learns from the key's redacted task traces and never changes a live turn",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
          const headers = { "x-credit-key": key.secret }
          const task = (yield* postJson(
            "/v1/tasks",
            { goal: "chat", max_steps: 10, budget: 50_000_000 },
            headers
          )).json as {
            task: { id: string }
            token: string
          }
          const turn = (content: string) =>
            postJson(
              "/v1/chat/completions",
              { model: OPENAI_CLASS, messages: [{ role: "user", content }], max_tokens: 40 },
              { ...headers, "x-task-token": task.token }
            )
          for (const content of ["one", "two two", "three three three"])
            assert.strictEqual((yield* turn(content)).status, 200)

          const sql = yield* SqlClient.SqlClient
          const state = Effect.map(
            sql<{ digest: string }>`
            SELECT md5(
              (SELECT COALESCE(string_agg((to_jsonb(k) - 'spent' - 'reserved' - 'folded' || to_jsonb(f))::text, '' ORDER BY key_id), '')
               FROM api_keys k JOIN key_figures f USING (key_id)) ||
              (SELECT COALESCE(string_agg(row_to_json(t)::text, '' ORDER BY task_id), '') FROM tasks t) ||
              (SELECT COALESCE(string_agg(row_to_json(s)::text, '' ORDER BY session_id), '') FROM sessions s) ||
              (SELECT COUNT(*)::text FROM task_calls)
            ) AS digest
          `.pipe(Effect.orDie),
            (rows) => rows[0]!.digest
          )
          const before = yield* state
          const optimized = yield* postJson(
            "/v1/evals/context/optimize",
            { task_ids: [task.task.id] },
            headers
          )
          assert.strictEqual(optimized.status, 200, optimized.text)
          const recommendation = optimized.json as {
            applied: boolean
            observed_calls: number
            recommended: { max_prompt_tokens: number; max_tokens: number } | null
          }
          assert.isFalse(recommendation.applied)
          assert.strictEqual(recommendation.observed_calls, 3)
          assert.isNotNull(recommendation.recommended)
          // Nothing a live turn reads moved: keys, tasks, sessions and calls are as they were.
          assert.strictEqual(yield* state, before)
          // And a turn after it is served as before.
          assert.strictEqual((yield* turn("four")).status, 200)
          // Someone else's key learns nothing from this key's tasks.
          const stranger = yield* fundedKey({ budget: 1_000, balance: 1_000 })
          const theirs = yield* postJson(
            "/v1/evals/context/optimize",
            {},
            { "x-credit-key": stranger.secret }
          )
          assert.strictEqual((theirs.json as { observed_calls: number }).observed_calls, 0)
        })
    )
  })
})
