import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import type { Hex } from "viem"
import { Conflict, InvalidRequest, Unauthorized } from "../domain/Errors.ts"
import type { RewardClaim, RewardGranted } from "../domain/Points.ts"
import { REWARD_POINTS, type RewardKind } from "./Earn.ts"
import { Points } from "./Points.ts"
import {
  intentWindow,
  REWARD_INTENT_SKEW_S,
  REWARD_INTENT_TTL_S,
  rewardIntentDigest,
  rewardIntentTypedData
} from "./RewardIntent.ts"
import { isSignedBy } from "./WalletSignature.ts"

export type RewardRefusal = InvalidRequest | Unauthorized | Conflict

/**
 * One-time rewards (spec 8; docs/decisions.md D65). The `(wallet, reward)` primary key of
 * `points_rewards` pays each reward once per wallet: a concurrent or later claim, replayed or freshly
 * signed, inserts nothing and is refused.
 */
export class Rewards extends Context.Service<
  Rewards,
  { readonly claim: (reward: RewardKind, claim: RewardClaim) => Effect.Effect<RewardGranted, RewardRefusal> }
>()("router/points/Rewards") {
  static readonly layer = Layer.effect(
    Rewards,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const points = yield* Points

      const claim = Effect.fn("Rewards.claim")(function* (reward: RewardKind, claim: RewardClaim) {
        const nowSeconds = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const window = intentWindow(claim.issued_at, nowSeconds)
        if (window !== "valid") {
          return yield* new InvalidRequest({
            code: window === "expired" ? "intent_expired" : "intent_not_yet_valid",
            param: "issued_at",
            message: `issued_at must be within ${REWARD_INTENT_TTL_S} s before and ${REWARD_INTENT_SKEW_S} s after the router clock; sign a new intent`
          })
        }
        const intent = {
          reward,
          wallet: claim.wallet,
          nonce: claim.nonce.toLowerCase() as Hex,
          issuedAt: claim.issued_at
        }
        if (!(yield* isSignedBy(rewardIntentTypedData(intent), claim.wallet, claim.signature))) {
          return yield* new Unauthorized({
            code: "invalid_reward_signature",
            message: `signature is not a PointsReward for "${reward}" signed by wallet over these fields`
          })
        }
        const wallet = claim.wallet.toLowerCase()
        const granted = REWARD_POINTS[reward]
        const paid = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const inserted = yield* sql`
                INSERT INTO points_rewards (wallet, reward, points, intent_digest, issued_at)
                VALUES (${wallet}, ${reward}, ${granted}, ${rewardIntentDigest(intent)}, ${claim.issued_at})
                ON CONFLICT DO NOTHING
                RETURNING wallet
              `
              if (inserted.length === 0) return false
              yield* points.addReward(wallet, granted)
              return true
            })
          )
          .pipe(Effect.orDie)
        if (!paid) {
          return yield* new Conflict({
            code: "reward_already_claimed",
            param: "wallet",
            message: `The ${reward} reward was already paid to ${wallet}; it pays once per wallet`
          })
        }
        const account = yield* points.account(wallet)
        return { object: "points_reward" as const, wallet, reward, points: granted, score: account.score }
      })

      return Rewards.of({ claim })
    })
  )
}
