/**
 * The points rules (spec 4.5, 8; docs/decisions.md D61–D64), pure. Amounts are integer base units of
 * the six-decimal stablecoin; points are integers.
 */
import type { RewardKindSchema, TierName } from "../domain/Points.ts"

/** Spec 8: 100 points per 1 unit of currency (1,000,000 base units), so one point per 10,000 base units. */
export const BASE_UNITS_PER_POINT = 10_000

/** Spec 8: a challenge stakes at least this many points. */
export const MIN_CHALLENGE_STAKE = 25

/** Spec 8: the one-time rewards. */
export const REWARD_POINTS = { follow: 100, demo_share: 250 } as const satisfies Record<
  typeof RewardKindSchema.Type,
  number
>
export type RewardKind = keyof typeof REWARD_POINTS

/** Points of a charged amount, rounded down (integer division; a charge is never negative). */
export const pointsOf = (charged: number) => Math.floor(charged / BASE_UNITS_PER_POINT)

/** A receipt's base earn: the points of its own charge. */
export const baseEarn = pointsOf

/** Spec 8: the stake of a challenge on a receipt charged `charged` base units. */
export const challengeStake = (charged: number) => Math.max(MIN_CHALLENGE_STAKE, baseEarn(charged))

/**
 * A wallet's earn from its receipts' charged sums. Rounding happens once, on the sum, so many small
 * receipts earn what one receipt of the same total would; `pending` is what landing would add.
 */
export const earnOf = (settledCharged: number, pendingCharged: number) => {
  const settled = pointsOf(settledCharged)
  return { settled, pending: pointsOf(settledCharged + pendingCharged) - settled }
}

/** The slash of an upheld challenge is its stake (D63); the challenger is paid half, rounded down. */
export const slashOf = (stake: number) => stake
export const bountyOf = (slash: number) => Math.floor(slash / 2)

export const TIERS = [
  { name: "platinum", min: 100_000 },
  { name: "gold", min: 10_000 },
  { name: "silver", min: 1_000 },
  { name: "bronze", min: 100 },
  { name: "member", min: 0 }
] as const satisfies ReadonlyArray<{ readonly name: TierName; readonly min: number }>

/** The highest tier whose threshold the score reaches, and the next one up (null at the top). */
export const tierOf = (score: number) => {
  const index = TIERS.findIndex((tier) => score >= tier.min)
  const at = index === -1 ? TIERS.length - 1 : index
  const next = at === 0 ? null : TIERS[at - 1]!
  return { tier: TIERS[at]!.name as TierName, next: next === null ? null : { name: next.name, at: next.min } }
}

export interface ProviderTotals {
  readonly settledCharged: number
  readonly receipts: number
  readonly receiptsOk: number
  readonly slashed: number
}

/** Basis points of receipts served in full (`status: ok`); null before the first receipt. */
export const reliabilityBps = (receipts: number, receiptsOk: number) =>
  receipts === 0 ? null : Math.floor((receiptsOk * 10_000) / receipts)

/**
 * A provider's score (D64): the points of the volume it served and was paid for, scaled by its
 * reliability, less the slashes of upheld challenges. Negative when slashes outweigh it.
 */
export const providerScore = (totals: ProviderTotals) => {
  const volume = pointsOf(totals.settledCharged)
  // bigint: volume times a receipt count can pass 2^53.
  const scaled =
    totals.receipts === 0 ? 0 : Number((BigInt(volume) * BigInt(totals.receiptsOk)) / BigInt(totals.receipts))
  return scaled - totals.slashed
}
