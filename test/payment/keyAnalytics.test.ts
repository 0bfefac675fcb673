import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { fundedKey, keySettled } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"

const chat = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "chat-medium",
  messages: [{ role: "user", content }],
  max_tokens: 24,
  ...extra
})

describe("key-scoped usage views: auctions/latest and bestex", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect(
      "only the key's own requests, in four views, grouped by session and parent task; agent headers echoed",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const mine = yield* fundedKey({ budget: 5_000_000, balance: 5_000_000 })
          const other = yield* fundedKey({ budget: 5_000_000, balance: 5_000_000 })
          const agentHeaders = {
            "x-credit-key": mine.secret,
            "x-routing-agent-role": "planner",
            "x-routing-parent-task": "job-42",
            "x-routing-agent-id": "node-a"
          }
          const planned = yield* postJson("/v1/chat/completions", chat("plan"), agentHeaders)
          assert.strictEqual(planned.status, 200)
          assert.strictEqual(planned.headers.get("x-routing-agent-role"), "planner")
          assert.strictEqual(planned.headers.get("x-routing-parent-task"), "job-42")
          assert.strictEqual(planned.headers.get("x-routing-agent-id"), "node-a")
          const sessionId = `s-${Math.random().toString(36).slice(2)}`
          const opened = yield* postJson(
            "/v1/chat/completions",
            chat("session", { routing: { session_id: sessionId } }),
            {
              "x-credit-key": mine.secret
            }
          )
          assert.strictEqual(opened.status, 200, opened.text)
          const foreign = yield* postJson("/v1/chat/completions", chat("not yours"), {
            "x-credit-key": other.secret
          })
          assert.strictEqual(foreign.status, 200)
          // The tape and best-execution read the receipts the captures write (D534: after the replies).
          yield* keySettled(mine.keyId)

          const auth = { headers: { "x-credit-key": mine.secret } }
          const json = (yield* call("/v1/auctions/latest?view=json", auth)).json as {
            version: string
            requests: Array<{ request_id: string; price_setter: string; agent: Record<string, string> }>
          }
          assert.strictEqual(json.version, "svc.auctions/1")
          const ids = json.requests.map((r) => r.request_id)
          assert.sameMembers(ids, [planned.headers.get("x-request-id"), opened.headers.get("x-request-id")])
          assert.notInclude(ids, foreign.headers.get("x-request-id"))
          const tape = yield* call("/v1/auctions/latest?view=tape", auth)
          assert.match(tape.headers.get("content-type") ?? "", /^text\/plain/)
          assert.strictEqual(tape.text.trim().split("\n").length, 2)
          assert.match(tape.text, /setter=(runner-up|phantom-reserve|own-bid)/)
          const replay = (yield* call("/v1/auctions/latest?view=replay", auth)).json as {
            auctions: Array<{
              mechanism: string
              bids: Array<{ rank: number; provider: string; outcome: string }>
            }>
          }
          for (const auction of replay.auctions) {
            assert.strictEqual(auction.mechanism, "second-score")
            assert.strictEqual(auction.bids[0]!.outcome, "won")
            for (const bid of auction.bids.slice(1)) assert.match(bid.provider, /^rival-\d+$/)
          }
          const tree = (yield* call("/v1/auctions/latest?view=tree", auth)).json as {
            sessions: Array<{ session_id: string }>
            parent_tasks: Array<{ parent_task: string; agents: Array<{ agent_id: string; role: string }> }>
          }
          assert.deepStrictEqual(
            tree.sessions.map((s) => s.session_id),
            [sessionId]
          )
          assert.strictEqual(tree.parent_tasks[0]!.parent_task, "job-42")
          assert.deepStrictEqual(tree.parent_tasks[0]!.agents[0], {
            ...tree.parent_tasks[0]!.agents[0]!,
            agent_id: "node-a",
            role: "planner"
          })
          assert.strictEqual((yield* call("/v1/auctions/latest")).status, 401)

          const bestex = (yield* call("/v1/keys/bestex", auth)).json as {
            fills: Array<{ charged: number; at_market_vwap: number; second_score_premium: number }>
            totals: { charged: number }
          }
          assert.strictEqual(bestex.fills.length, 2)
          assert.strictEqual(
            bestex.totals.charged,
            bestex.fills.reduce((n, f) => n + f.charged, 0)
          )
          for (const fill of bestex.fills) assert.isAbove(fill.at_market_vwap, 0)
        })
    )
  })
})
