import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { adaptersRouter, OPENAI_CLASS, providerRequests, waitForBook } from "../adapters/support.ts"
import { fundedKey } from "../support/Keys.ts"
import { call, postJson } from "../support/Router.ts"

interface Created {
  readonly task: { readonly id: string; readonly budget: number; readonly state: string }
  readonly token: string
}

const createTask = (body: Record<string, unknown>, headers: Record<string, string> = {}) =>
  Effect.map(postJson("/v1/tasks", { goal: "test the router", max_steps: 50, ...body }, headers), (r) => {
    assert.strictEqual(r.status, 200, r.text)
    return r.json as Created
  })

const chat = (headers: Record<string, string>, content = "Say hello.") =>
  postJson(
    "/v1/chat/completions",
    { model: OPENAI_CLASS, messages: [{ role: "user", content }], max_tokens: 32 },
    headers
  )

const taskMoney = (taskId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [task] = yield* sql<{ budget: string; spent: string; held: string; steps: number }>`
      SELECT budget, spent, held, steps FROM tasks WHERE task_id = ${taskId}
    `
    const [receipts] = yield* sql<{ total: string | null; n: string }>`
      SELECT COALESCE(SUM((r.body->>'charged')::bigint), 0)::text AS total, COUNT(*)::text AS n
      FROM task_calls c JOIN receipts r ON r.request_id = c.request_id WHERE c.task_id = ${taskId}
    `
    const [calls] = yield* sql<{ n: string; worst: string | null }>`
      SELECT COUNT(*)::text AS n, MAX(held)::text AS worst FROM task_calls WHERE task_id = ${taskId}
    `
    return {
      budget: Number(task!.budget),
      spent: Number(task!.spent),
      held: Number(task!.held),
      steps: task!.steps,
      receiptsTotal: Number(receipts!.total),
      receipts: Number(receipts!.n),
      calls: Number(calls!.n),
      worstCase: Number(calls!.worst ?? 0)
    }
  }).pipe(Effect.orDie)

describe("durable tasks over HTTP (spec 4.3)", () => {
  layer(adaptersRouter, { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect(
      "the capability is returned once and stored only hashed; a wrong or missing one reveals nothing",
      () =>
        Effect.gen(function* () {
          const { task, token } = yield* createTask({ budget: 1_000, retention_hours: 2 })
          assert.match(token, /^svc_tt_/)
          assert.strictEqual(task.state, "pending")
          const sql = yield* SqlClient.SqlClient
          const [row] = yield* sql<{
            stored: string
          }>`SELECT row_to_json(t)::text AS stored FROM tasks t`.pipe(Effect.orDie)
          assert.notInclude(row!.stored, token)

          const ok = yield* call(`/v1/tasks/${task.id}`, { headers: { "x-task-token": token } })
          assert.strictEqual(ok.status, 200)
          assert.deepInclude(ok.json as object, {
            id: task.id,
            budget: 1_000,
            retention_hours: 2,
            remaining: 1_000
          })

          const wrong = yield* call(`/v1/tasks/${task.id}`, { headers: { "x-task-token": `${token}x` } })
          const missing = yield* call(`/v1/tasks/${task.id}`)
          const unknown = yield* call("/v1/tasks/task_doesnotexist", { headers: { "x-task-token": token } })
          for (const reply of [wrong, missing, unknown]) {
            assert.strictEqual(reply.status, 401)
            assert.deepStrictEqual(reply.json, wrong.json)
          }
          const retention = yield* postJson("/v1/tasks", {
            goal: "g",
            max_steps: 1,
            budget: 0,
            retention_hours: 721
          })
          assert.strictEqual(retention.status, 400)
        })
    )

    it.effect("the owning governed key authorizes like the token; another key does not", () =>
      Effect.gen(function* () {
        const owner = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const other = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
        const { task } = yield* createTask({ budget: 10 }, { "x-credit-key": owner.secret })
        const mine = yield* call(`/v1/tasks/${task.id}`, { headers: { "x-credit-key": owner.secret } })
        assert.strictEqual(mine.status, 200)
        const theirs = yield* call(`/v1/tasks/${task.id}`, { headers: { "x-credit-key": other.secret } })
        assert.strictEqual(theirs.status, 401)
      })
    )

    it.effect(
      "paid calls are steps held within the budget: never over under concurrency, spent = receipts",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
          // One call on a roomy task tells the worst case a call of this shape holds.
          const probe = yield* createTask({ budget: 10_000_000 })
          const first = yield* chat({ "x-credit-key": key.secret, "x-task-token": probe.token })
          assert.strictEqual(first.status, 200, first.text)
          const probed = yield* taskMoney(probe.task.id)
          assert.strictEqual(probed.steps, 1)
          assert.strictEqual(probed.held, 0)
          assert.strictEqual(probed.spent, probed.receiptsTotal)
          assert.isAbove(probed.spent, 0)
          const worstCase = probed.worstCase

          // Room for about three worst cases, twelve calls at once.
          const { task, token } = yield* createTask({ budget: Math.floor(worstCase * 3.5) })
          const before = yield* providerRequests
          const replies = yield* Effect.forEach(
            Array.from({ length: 12 }, (_, i) => i),
            (i) => chat({ "x-credit-key": key.secret, "x-task-token": token }, `Hello ${i}`),
            { concurrency: "unbounded" }
          )
          const served = replies.filter((r) => r.status === 200)
          const refused = replies.filter((r) => r.status === 402)
          assert.strictEqual(served.length + refused.length, 12, replies.map((r) => r.status).join(","))
          assert.isAtLeast(served.length, 1)
          assert.isAtLeast(refused.length, 1)
          for (const reply of refused) {
            assert.strictEqual((reply.json as { code: string }).code, "task_budget_exhausted")
          }
          const money = yield* taskMoney(task.id)
          assert.isAtMost(money.spent, money.budget)
          assert.strictEqual(money.held, 0)
          assert.strictEqual(money.spent, money.receiptsTotal)
          assert.strictEqual(money.steps, served.length)
          assert.strictEqual(money.receipts, served.length)
          // Refused calls reached no provider.
          assert.strictEqual((yield* providerRequests) - before, served.length)

          const view = (yield* call(`/v1/tasks/${task.id}`, { headers: { "x-task-token": token } })).json as {
            spent: number
            steps: number
          }
          assert.strictEqual(view.spent, money.spent)
          const badToken = yield* chat({ "x-credit-key": key.secret, "x-task-token": "svc_tt_nope" })
          assert.strictEqual(badToken.status, 401)
        })
    )

    it.effect("a task out of steps refuses the next paid call with 402 before any provider work", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
        const { task, token } = yield* createTask({ budget: 10_000_000, max_steps: 1 })
        const one = yield* chat({ "x-credit-key": key.secret, "x-task-token": token })
        assert.strictEqual(one.status, 200, one.text)
        const before = yield* providerRequests
        const two = yield* chat({ "x-credit-key": key.secret, "x-task-token": token })
        assert.strictEqual(two.status, 402)
        assert.strictEqual((two.json as { code: string }).code, "task_steps_exhausted")
        assert.strictEqual(yield* providerRequests, before)
        assert.strictEqual((yield* taskMoney(task.id)).steps, 1)
      })
    )

    it.effect("delete erases the run and its records at once", () =>
      Effect.gen(function* () {
        const { task, token } = yield* createTask({ budget: 0 })
        const headers = { "x-task-token": token }
        const claim = yield* postJson(`/v1/tasks/${task.id}/claim`, { worker: "w1" }, headers)
        assert.strictEqual(claim.status, 200, claim.text)
        const fence = (claim.json as { lease: { fence: number } }).lease.fence
        assert.strictEqual(
          (yield* postJson(`/v1/tasks/${task.id}/checkpoints`, { fence, execution: { step: 1 } }, headers))
            .status,
          200
        )
        assert.strictEqual(
          (yield* postJson(`/v1/tasks/${task.id}/effects/e1/begin`, { fence }, headers)).status,
          200
        )
        const erased = yield* call(`/v1/tasks/${task.id}`, { method: "DELETE", headers })
        assert.strictEqual(erased.status, 200)
        const sql = yield* SqlClient.SqlClient
        for (const table of ["tasks", "task_events", "task_checkpoints", "task_effects"]) {
          const [row] = yield* sql<{ n: string }>`
            SELECT COUNT(*)::text AS n FROM ${sql(table)} WHERE task_id = ${task.id}
          `.pipe(Effect.orDie)
          assert.strictEqual(row!.n, "0", table)
        }
        assert.strictEqual((yield* call(`/v1/tasks/${task.id}`, { headers })).status, 401)
      })
    )
  })
})
