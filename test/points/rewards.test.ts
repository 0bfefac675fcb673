import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { PointsAccount } from "../../src/domain/Points.ts"
import { call, postJson, routerLayer } from "../support/Router.ts"
import { newWallet, signedReward } from "./support.ts"

interface ErrorBody {
  readonly error: { readonly code: string; readonly param: string | null }
}

const account = (wallet: string) => Effect.map(call(`/v1/points/${wallet}`), (r) => r.json as PointsAccount)

const rewardRows = (wallet: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM points_rewards WHERE wallet = ${wallet.toLowerCase()}`
    return rows[0]!.n
  }).pipe(Effect.orDie)

describe("one-time rewards: wallet-signed intents, paid once per wallet", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect(
      "follow (100) and demo share (250) each pay once; replays, old and future intents are refused",
      () =>
        Effect.gen(function* () {
          const wallet = newWallet()
          const fresh = yield* account(wallet.address)
          assert.deepStrictEqual(
            [fresh.score, fresh.tier, fresh.rank, fresh.rewards],
            [0, "member", null, { follow: false, demo_share: false, points: 0 }]
          )

          const follow = yield* signedReward(wallet, "follow")
          const paid = yield* postJson("/v1/points/follow", follow)
          assert.strictEqual(paid.status, 200, paid.text)
          assert.deepStrictEqual(paid.json, {
            object: "points_reward",
            wallet: wallet.address.toLowerCase(),
            reward: "follow",
            points: 100,
            score: 100
          })

          // The same signed intent again, and a freshly signed one: nothing more is paid.
          const replay = yield* postJson("/v1/points/follow", follow)
          assert.strictEqual(replay.status, 409)
          assert.strictEqual((replay.json as ErrorBody).error.code, "reward_already_claimed")
          const again = yield* postJson("/v1/points/follow", yield* signedReward(wallet, "follow"))
          assert.strictEqual((again.json as ErrorBody).error.code, "reward_already_claimed")

          // A follow intent is no demo-share intent.
          const crossed = yield* postJson("/v1/points/demo-share", follow)
          assert.strictEqual(crossed.status, 401)
          assert.strictEqual((crossed.json as ErrorBody).error.code, "invalid_reward_signature")

          const now = Math.floor(Date.now() / 1000)
          const expired = yield* postJson(
            "/v1/points/demo-share",
            yield* signedReward(wallet, "demo_share", now - 400)
          )
          assert.strictEqual(expired.status, 400)
          assert.deepStrictEqual((expired.json as ErrorBody).error, {
            ...(expired.json as ErrorBody).error,
            code: "intent_expired",
            param: "issued_at"
          })
          const future = yield* postJson(
            "/v1/points/demo-share",
            yield* signedReward(wallet, "demo_share", now + 120)
          )
          assert.strictEqual((future.json as ErrorBody).error.code, "intent_not_yet_valid")

          // Signed by another wallet for this one.
          const forged = { ...(yield* signedReward(newWallet(), "demo_share")), wallet: wallet.address }
          const refused = yield* postJson("/v1/points/demo-share", forged)
          assert.strictEqual(refused.status, 401)
          const malformed = yield* postJson("/v1/points/demo-share", { ...forged, signature: "0x1234" })
          assert.strictEqual(malformed.status, 401)
          const invalid = yield* postJson("/v1/points/demo-share", { wallet: "nope" })
          assert.strictEqual(invalid.status, 400)

          const share = yield* postJson("/v1/points/demo-share", yield* signedReward(wallet, "demo_share"))
          assert.strictEqual(share.status, 200, share.text)
          const after = yield* account(wallet.address)
          assert.deepStrictEqual(
            [after.score, after.tier, after.available, after.earn, after.rewards],
            [350, "bronze", 350, { settled: 0, pending: 0 }, { follow: true, demo_share: true, points: 350 }]
          )
          assert.strictEqual(yield* rewardRows(wallet.address), 2)
        })
    )

    it.effect(
      "twenty concurrent claims of one reward by one wallet (replayed or freshly signed): one pays",
      () =>
        Effect.gen(function* () {
          const wallet = newWallet()
          const one = yield* signedReward(wallet, "demo_share")
          const claims = [
            ...Array.from({ length: 10 }, () => Effect.succeed(one)),
            ...Array.from({ length: 10 }, () => signedReward(wallet, "demo_share"))
          ]
          const replies = yield* Effect.forEach(
            claims,
            (claim) => Effect.flatMap(claim, (body) => postJson("/v1/points/demo-share", body)),
            { concurrency: "unbounded" }
          )
          const statuses = replies.map((r) => r.status).sort()
          assert.deepStrictEqual(statuses, [200, ...Array.from({ length: 19 }, () => 409)])
          assert.strictEqual((yield* account(wallet.address)).score, 250)
          assert.strictEqual(yield* rewardRows(wallet.address), 1)
        })
    )

    it.effect(
      "the leaderboard ranks wallets by score (ties share a rank) and each account knows its rank",
      () =>
        Effect.gen(function* () {
          const wallets = [newWallet(), newWallet(), newWallet()]
          yield* postJson("/v1/points/follow", yield* signedReward(wallets[0]!, "follow"))
          yield* postJson("/v1/points/follow", yield* signedReward(wallets[1]!, "follow"))
          yield* postJson("/v1/points/demo-share", yield* signedReward(wallets[1]!, "demo_share"))
          yield* postJson("/v1/points/demo-share", yield* signedReward(wallets[2]!, "demo_share"))
          const board = yield* call("/v1/points/leaderboard?limit=100")
          assert.strictEqual(board.status, 200)
          const data = (board.json as { data: Array<{ rank: number; wallet: string; score: number }> }).data
          const scores = data.map((e) => e.score)
          assert.deepStrictEqual(
            scores,
            [...scores].sort((a, b) => b - a)
          )
          for (const entry of data) {
            assert.strictEqual(entry.rank, 1 + scores.filter((s) => s > entry.score).length)
            assert.strictEqual((yield* account(entry.wallet)).rank, entry.rank)
          }
          assert.isTrue(data.some((e) => e.wallet === wallets[1]!.address.toLowerCase() && e.score === 350))
          const limited = yield* call("/v1/points/leaderboard?limit=1")
          assert.strictEqual((limited.json as { data: Array<unknown> }).data.length, 1)
          assert.strictEqual((yield* call("/v1/points/leaderboard?limit=0")).status, 400)
          assert.strictEqual((yield* call("/v1/points/not-a-wallet")).status, 400)
        })
    )
  })
})
