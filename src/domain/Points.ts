import { Schema } from "effect"
import { Hex32, SignatureHex, WalletAddress } from "./Wire.ts"

/** The points wire (spec 4.5, 8): accounts, the leaderboard, providers and the one-time rewards. */

const Points = Schema.Int
const Count = Schema.Int

/** The tiers, highest first; their thresholds are the rules' (`points/Earn.ts` `TIERS`). */
export const TierName = Schema.Literals(["platinum", "gold", "silver", "bronze", "member"])
export type TierName = typeof TierName.Type

/** `GET /v1/points/:wallet`: score, tier, rank, earn and the challenge ledger (D61–D64). */
export const PointsAccount = Schema.Struct({
  object: Schema.Literal("points_account"),
  wallet: Schema.String,
  unit: Schema.Literal("points"),
  /** Settled points: settled earn + rewards + bounties − forfeited stakes. */
  score: Points,
  tier: TierName,
  next_tier: Schema.NullOr(Schema.Struct({ name: TierName, at: Points })),
  /** 1 + the number of wallets with a higher score; null while the score is 0. */
  rank: Schema.NullOr(Schema.Int),
  /** What a challenge stake may lock: score − locked stake. */
  available: Points,
  earn: Schema.Struct({ settled: Points, pending: Points }),
  rewards: Schema.Struct({ follow: Schema.Boolean, demo_share: Schema.Boolean, points: Points }),
  challenges: Schema.Struct({
    open: Count,
    won: Count,
    lost: Count,
    ambiguous: Count,
    locked_stake: Points,
    earned_bounties: Points,
    forfeited_stakes: Points,
    /** earned_bounties − forfeited_stakes */
    net: Points
  })
})
export type PointsAccount = typeof PointsAccount.Type

export const LeaderboardEntry = Schema.Struct({
  rank: Schema.Int,
  wallet: Schema.String,
  score: Points,
  tier: TierName
})
export type LeaderboardEntry = typeof LeaderboardEntry.Type

export const Leaderboard = Schema.Struct({
  object: Schema.Literal("list"),
  unit: Schema.Literal("points"),
  data: Schema.Array(LeaderboardEntry)
})

/** `GET /v1/points/provider/:id`: served volume, reliability and slashes (D64). */
export const ProviderPoints = Schema.Struct({
  object: Schema.Literal("provider_points"),
  provider_id: Schema.String,
  unit: Schema.Literal("points"),
  score: Points,
  earn: Schema.Struct({ settled: Points, pending: Points }),
  served: Schema.Struct({
    receipts: Count,
    receipts_ok: Count,
    /** Basis points of receipts with `status: ok`; null before the first. */
    reliability_bps: Schema.NullOr(Schema.Int),
    /** Base units charged on receipts whose settlement landed. */
    settled_volume: Schema.Int
  }),
  challenges: Schema.Struct({ upheld: Count, slashed: Points })
})
export type ProviderPoints = typeof ProviderPoints.Type

export const RewardKindSchema = Schema.Literals(["follow", "demo_share"])

/** `POST /v1/points/follow` and `/v1/points/demo-share`: the intent's fields and the wallet's signature. */
export const RewardClaim = Schema.Struct({
  wallet: WalletAddress,
  nonce: Hex32,
  issued_at: Schema.Int.check(Schema.isGreaterThan(0)),
  signature: SignatureHex
})
export type RewardClaim = typeof RewardClaim.Type

export const RewardGranted = Schema.Struct({
  object: Schema.Literal("points_reward"),
  wallet: Schema.String,
  reward: RewardKindSchema,
  points: Points,
  score: Points
})
export type RewardGranted = typeof RewardGranted.Type
