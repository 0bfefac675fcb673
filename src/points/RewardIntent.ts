import { type Address, getAddress, type Hex, hashTypedData, type TypedDataDefinition } from "viem"
import type { RewardKind } from "./Earn.ts"

/**
 * The EIP-712 intent a wallet signs to claim a one-time reward (docs/protocol.md section 7). Off-chain
 * like the challenge program, so the domain carries no `chainId` (docs/decisions.md D65).
 */
export const POINTS_DOMAIN = { name: "svc Points", version: "1" } as const

export const rewardIntentTypes = {
  PointsReward: [
    { name: "reward", type: "string" },
    { name: "wallet", type: "address" },
    { name: "nonce", type: "bytes32" },
    { name: "issuedAt", type: "uint256" }
  ]
} as const

/** An intent is accepted up to this many seconds after `issuedAt`... */
export const REWARD_INTENT_TTL_S = 300
/** ...and this many before it (spec 8 clock skew). */
export const REWARD_INTENT_SKEW_S = 5

export interface RewardIntent {
  readonly reward: RewardKind
  readonly wallet: string
  readonly nonce: Hex
  readonly issuedAt: number
}

export const rewardIntentTypedData = (intent: RewardIntent) =>
  ({
    domain: POINTS_DOMAIN,
    types: rewardIntentTypes,
    primaryType: "PointsReward",
    message: {
      reward: intent.reward,
      wallet: getAddress(intent.wallet) as Address,
      nonce: intent.nonce,
      issuedAt: BigInt(intent.issuedAt)
    }
  }) satisfies TypedDataDefinition<typeof rewardIntentTypes, "PointsReward">

export const rewardIntentDigest = (intent: RewardIntent) => hashTypedData(rewardIntentTypedData(intent))

/** Where `issuedAt` stands against the router clock: inside the window, expired, or from the future. */
export const intentWindow = (issuedAt: number, nowSeconds: number) =>
  issuedAt > nowSeconds + REWARD_INTENT_SKEW_S
    ? ("not_yet_valid" as const)
    : nowSeconds - issuedAt > REWARD_INTENT_TTL_S
      ? ("expired" as const)
      : ("valid" as const)
