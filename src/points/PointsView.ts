import { Schema } from "effect"
import { TIERS } from "./Earn.ts"

/** A wallet as sent: 0x and 20 bytes of hex, any letter case (stored lowercase). */
export const WalletAddress = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]{40}$/, { message: "expected a 0x-prefixed 20-byte address" })
)
export const Hex32 = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]{64}$/, { message: "expected 32 bytes of 0x-prefixed hex" })
)
export const SignatureHex = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]+$/, { message: "expected 0x hex" })
)

const Points = Schema.Int
const Count = Schema.Int
export const TierName = Schema.Literals(TIERS.map((tier) => tier.name))

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

export const RewardGranted = Schema.Struct({
  object: Schema.Literal("points_reward"),
  wallet: Schema.String,
  reward: RewardKindSchema,
  points: Points,
  score: Points
})
export type RewardGranted = typeof RewardGranted.Type
