import { assert, describe, layer } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { OtlpTrace, TaskView, Verdict } from "../../src/domain/Tasks.ts"
import { TaskBudgets } from "../../src/payment/TaskBudgets.ts"
import { adaptersRouter, OPENAI_CLASS, providerRequests, waitForBook } from "../adapters/support.ts"
import { faultFor } from "../support/Faults.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitFor } from "../support/Pay.ts"
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
          Schema.decodeUnknownSync(TaskView)(ok.json)
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

    it.effect(
      "a task's call whose capture a database fault deferred keeps its hold, and is charged once the capture lands",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
          const { task, token } = yield* createTask({ budget: 10_000_000 })
          // Every settlement of this payer's requests fails in Postgres until the trigger goes.
          const lift = yield* faultFor(key.wallet, "settle")
          const reply = yield* chat({ "x-credit-key": key.secret, "x-task-token": token })
          assert.strictEqual(reply.status, 200, reply.text)
          // Still reserved: the call is a step of the task and its worst case stays held.
          const pending = yield* taskMoney(task.id)
          assert.deepStrictEqual([pending.calls, pending.steps, pending.spent], [1, 1, 0])
          assert.isAbove(pending.held, 0)
          yield* lift
          yield* waitFor(
            "the deferred capture",
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM requests WHERE payer = ${key.wallet} AND status = 'captured'`.pipe(
                Effect.orDie
              ),
              (rows) => (rows[0]!.n === 1 ? true : undefined)
            ),
            60_000
          )
          // The stale pass (or the hold's own release, had it come later) charges what the receipt says.
          yield* (yield* TaskBudgets).settleStale(0)
          const settled = yield* taskMoney(task.id)
          assert.deepStrictEqual(
            [settled.held, settled.steps, settled.receipts, settled.spent],
            [0, 1, 1, settled.receiptsTotal]
          )
          assert.isAbove(settled.spent, 0)
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
    it.effect(
      "an acceptance contract freezes once; a client's verification.passed never satisfies it; verify grades the records",
      () =>
        Effect.gen(function* () {
          const { task, token } = yield* createTask({ budget: 0 })
          const headers = { "x-task-token": token }
          const path = `/v1/tasks/${task.id}`
          const contract = {
            required_events: ["milestone.done", "checkpoint.saved"],
            effects_resolved: true,
            budget_not_exceeded: true,
            required_approvals: ["deploy"],
            required_artifacts: ["out/report.md"],
            output_schema: {
              type: "object",
              properties: { score: { type: "integer", minimum: 0 } },
              required: ["score"]
            }
          }
          const put = (body: unknown) =>
            call(`${path}/acceptance`, {
              method: "PUT",
              headers: { ...headers, "content-type": "application/json" },
              body: JSON.stringify(body)
            })
          assert.strictEqual((yield* put({ output_schema: { type: "string", pattern: "x" } })).status, 400)
          assert.strictEqual((yield* put(contract)).status, 200)
          assert.strictEqual((yield* put(contract)).status, 200)
          const changed = yield* put({ ...contract, effects_resolved: false })
          assert.strictEqual(changed.status, 409)
          assert.strictEqual((changed.json as { error: { code: string } }).error.code, "acceptance_frozen")

          // The client claims success and names router events itself: neither counts.
          for (const type of ["verification.passed", "checkpoint.saved", "milestone.done"]) {
            assert.strictEqual((yield* postJson(`${path}/events`, { type }, headers)).status, 200)
          }
          const viewed = (yield* call(path, { headers })).json as { state: string }
          assert.strictEqual(viewed.state, "pending")
          const early = yield* postJson(`${path}/verify`, { output: { score: 3 } }, headers)
          assert.strictEqual(early.status, 200, early.text)
          const failed = early.json as {
            passed: boolean
            state: string
            checks: Array<{ name: string; passed: boolean }>
          }
          assert.isFalse(failed.passed)
          assert.strictEqual(failed.state, "failed")
          assert.deepStrictEqual(
            failed.checks.filter((c) => !c.passed).map((c) => c.name),
            ["required_events", "required_approvals", "required_artifacts"]
          )

          // Now do the work: a checkpoint under a lease, an effect resolved, an approval, the artifact.
          const claim = yield* postJson(`${path}/claim`, {}, headers)
          const fence = (claim.json as { lease: { fence: number } }).lease.fence
          yield* postJson(`${path}/checkpoints`, { fence, execution: { step: 1 } }, headers)
          yield* postJson(`${path}/effects/mail/begin`, { fence }, headers)
          yield* postJson(`${path}/effects/mail/complete`, { fence, result: { ok: true } }, headers)
          yield* postJson(
            `${path}/events`,
            { type: "approval.granted", data: { approval_id: "deploy" } },
            headers
          )
          const snap = yield* postJson(
            `${path}/workspace-snapshots`,
            { files: [{ path: "out/report.md", content: "# done" }] },
            headers
          )
          assert.strictEqual(snap.status, 200, snap.text)
          const badOutput = yield* postJson(`${path}/verify`, { output: { score: "high" } }, headers)
          assert.deepStrictEqual(
            (badOutput.json as { checks: Array<{ name: string; passed: boolean }> }).checks
              .filter((c) => !c.passed)
              .map((c) => c.name),
            ["output_schema"]
          )
          const good = yield* postJson(`${path}/verify`, { output: { score: 3 } }, headers)
          const passed = Schema.decodeUnknownSync(Verdict)(good.json)
          assert.isTrue(passed.passed)
          assert.strictEqual(passed.state, "succeeded")
          const view = (yield* call(path, { headers })).json as {
            approvals: Array<{ approval_id: string; decision: string }>
          }
          assert.deepStrictEqual(
            view.approvals.map((a) => [a.approval_id, a.decision]),
            [["deploy", "granted"]]
          )
          const events = (yield* call(`${path}/events?cursor=${passed.event_seq - 1}`, { headers })).json as {
            data: Array<{ type: string; source: string }>
          }
          assert.deepStrictEqual(events.data[0], {
            ...events.data[0]!,
            type: "verification.passed",
            source: "router"
          })
        })
    )

    it.effect("a rubric review is graded through the paid path, held on and paid by the task", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
        const { task, token } = yield* createTask({ budget: 10_000_000 })
        const headers = { "x-task-token": token }
        const path = `/v1/tasks/${task.id}`
        const put = yield* call(`${path}/acceptance`, {
          method: "PUT",
          headers: { ...headers, "content-type": "application/json" },
          body: JSON.stringify({
            rubric: { instructions: "The summary names three risks.", model: OPENAI_CLASS }
          })
        })
        assert.strictEqual(put.status, 200, put.text)
        // Without a payment the review cannot be bought: a 402, nothing held.
        const unpaid = yield* postJson(`${path}/verify`, { output: "risks: a, b, c" }, headers)
        assert.strictEqual(unpaid.status, 402, unpaid.text)
        assert.strictEqual((yield* taskMoney(task.id)).calls, 0)

        const paid = yield* postJson(
          `${path}/verify`,
          { output: "risks: a, b, c" },
          {
            ...headers,
            "x-credit-key": key.secret
          }
        )
        assert.strictEqual(paid.status, 200, paid.text)
        const verdict = paid.json as {
          passed: boolean
          review: { request_id: string; passed: boolean; charged: number }
          checks: Array<{ name: string; passed: boolean }>
        }
        assert.match(verdict.review.request_id, /^req_/)
        assert.isAbove(verdict.review.charged, 0)
        assert.strictEqual(verdict.passed, verdict.review.passed)
        const money = yield* taskMoney(task.id)
        assert.deepInclude(money, { calls: 1, steps: 1, held: 0, spent: verdict.review.charged })
        assert.strictEqual(money.spent, money.receiptsTotal)
        const receipt = yield* call(`/v1/receipts/${verdict.review.request_id}`)
        assert.strictEqual(receipt.status, 200)
      })
    )

    it.effect(
      "workspace snapshots store content once; a fork keeps lineage on both; erasure keeps what a fork names",
      () =>
        Effect.gen(function* () {
          const { task, token } = yield* createTask({ budget: 0 })
          const headers = { "x-task-token": token }
          const path = `/v1/tasks/${task.id}`
          const shared = "x".repeat(10_000)
          const store = (files: ReadonlyArray<Record<string, string>>) =>
            Effect.map(postJson(`${path}/workspace-snapshots`, { files }, headers), (reply) => {
              assert.strictEqual(reply.status, 200, reply.text)
              return reply.json as {
                snapshot_id: string
                new_bytes: number
                files: Array<{ path: string; hash: string }>
              }
            })
          const first = yield* store([
            { path: "a.txt", content: shared },
            { path: "b.bin", content_base64: "AAEC" }
          ])
          assert.strictEqual(first.new_bytes, 10_003)
          const second = yield* store([
            { path: "copy/a.txt", content: shared },
            { path: "c.txt", content: "new" }
          ])
          assert.strictEqual(second.new_bytes, 3)
          assert.strictEqual(second.files[0]!.hash, first.files[0]!.hash)
          const sql = yield* SqlClient.SqlClient
          const blobCount = (hash: string) =>
            Effect.map(
              sql<{ n: string }>`SELECT COUNT(*)::text AS n FROM workspace_blobs WHERE hash = ${hash}`.pipe(
                Effect.orDie
              ),
              (rows) => Number(rows[0]!.n)
            )
          assert.strictEqual(yield* blobCount(first.files[0]!.hash), 1)

          const forked = yield* postJson(
            `${path}/workspace-snapshots/${first.snapshot_id}/fork`,
            { budget: 5 },
            headers
          )
          assert.strictEqual(forked.status, 200, forked.text)
          const child = forked.json as Created & {
            task: { lineage: { parent_task_id: string; parent_snapshot_id: string } }
          }
          assert.deepInclude(child.task.lineage, {
            parent_task_id: task.id,
            parent_snapshot_id: first.snapshot_id
          })
          assert.strictEqual(child.task.budget, 5)
          const parentView = (yield* call(path, { headers })).json as {
            lineage: { forks: Array<{ task_id: string; snapshot_id: string }> }
          }
          assert.deepStrictEqual(parentView.lineage.forks, [
            { task_id: child.task.id, snapshot_id: first.snapshot_id }
          ])
          const childHeaders = { "x-task-token": child.token }
          const readByChild = yield* call(
            `/v1/tasks/${child.task.id}/workspace-snapshots/${first.snapshot_id}`,
            {
              headers: childHeaders
            }
          )
          assert.strictEqual(readByChild.status, 200)
          assert.strictEqual(
            (readByChild.json as { files: Array<{ content_base64: string }> }).files[0]!.content_base64,
            Buffer.from(shared).toString("base64")
          )

          // Erasing the parent keeps the snapshot its fork starts from, drops the other and its own bytes.
          assert.strictEqual((yield* call(path, { method: "DELETE", headers })).status, 200)
          const again = yield* call(`/v1/tasks/${child.task.id}/workspace-snapshots/${first.snapshot_id}`, {
            headers: childHeaders
          })
          assert.strictEqual(again.status, 200)
          assert.strictEqual(yield* blobCount(second.files[1]!.hash), 0)
          assert.strictEqual(yield* blobCount(first.files[0]!.hash), 1)
          const childView = (yield* call(`/v1/tasks/${child.task.id}`, { headers: childHeaders })).json as {
            lineage: { parent_task_id: string }
          }
          assert.strictEqual(childView.lineage.parent_task_id, task.id)
          assert.strictEqual(
            (yield* call(`/v1/tasks/${child.task.id}`, { method: "DELETE", headers: childHeaders })).status,
            200
          )
          assert.strictEqual(yield* blobCount(first.files[0]!.hash), 0)
        })
    )

    it.effect(
      "the OTLP trace shows the paid calls, claims, checkpoints, effects and verification, redacted",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = yield* fundedKey({ budget: 1_000_000_000, balance: 1_000_000_000 })
          const { task, token } = yield* createTask({ budget: 10_000_000 })
          const headers = { "x-task-token": token }
          const path = `/v1/tasks/${task.id}`
          const secretPrompt = "the secret prompt words zebra-quartz"
          const paid = yield* chat({ "x-credit-key": key.secret, "x-task-token": token }, secretPrompt)
          assert.strictEqual(paid.status, 200, paid.text)
          const claim = yield* postJson(`${path}/claim`, { worker: "tracer" }, headers)
          const fence = (claim.json as { lease: { fence: number } }).lease.fence
          yield* postJson(
            `${path}/checkpoints`,
            { fence, execution: { memo: "private-checkpoint-memo" } },
            headers
          )
          yield* postJson(
            `${path}/effects/pay-1/begin`,
            { fence, description: { to: "private-recipient" } },
            headers
          )
          yield* postJson(`${path}/events`, { type: "note", data: { text: "private-client-note" } }, headers)
          yield* postJson(`${path}/verify`, {}, headers)
          const trace = yield* call(`${path}/trace/otlp`, { headers })
          assert.strictEqual(trace.status, 200, trace.text)
          Schema.decodeUnknownSync(OtlpTrace)(trace.json)
          const spans = (
            trace.json as {
              resourceSpans: Array<{
                scopeSpans: Array<{ spans: Array<{ name: string; attributes: Array<{ key: string }> }> }>
              }>
            }
          ).resourceSpans[0]!.scopeSpans[0]!.spans
          const names = spans.map((s) => s.name)
          for (const name of [
            "task",
            "task.paid_call",
            "task.claimed",
            "checkpoint.saved",
            "task.effect",
            "verification.failed"
          ]) {
            assert.include(names, name)
          }
          const paidSpan = spans.find((s) => s.name === "task.paid_call")!
          assert.includeMembers(
            paidSpan.attributes.map((a) => a.key),
            ["request.id", "request.charged", "provider.id", "model.class"]
          )
          for (const secret of [
            secretPrompt,
            token,
            key.secret,
            "private-checkpoint-memo",
            "private-recipient",
            "private-client-note"
          ]) {
            assert.notInclude(trace.text, secret)
          }
        })
    )
  })
})
