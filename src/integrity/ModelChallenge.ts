import { type Address, getAddress, type Hex, hashTypedData, type TypedDataDefinition } from "viem"

/**
 * Spec 2.10: the EIP-712 typed data a challenger signs to open a challenge. The domain is exactly the
 * spec's, `name` and `version` with no `chainId` (docs/decisions.md D66).
 */
export const MODEL_CHALLENGE_DOMAIN = { name: "svc Model Integrity", version: "1" } as const

export const modelChallengeTypes = {
  ModelChallenge: [
    { name: "purpose", type: "string" },
    { name: "wallet", type: "address" },
    { name: "receiptId", type: "string" },
    { name: "evidenceHash", type: "bytes32" }
  ]
} as const

/** The human-readable line a wallet shows when it signs; a filing must carry it exactly. */
export const MODEL_CHALLENGE_PURPOSE =
  "I open a model-integrity challenge on this receipt and stake points on it"

export interface ModelChallengeMessage {
  readonly wallet: string
  readonly receiptId: string
  readonly evidenceHash: Hex
}

export const modelChallengeTypedData = (message: ModelChallengeMessage) =>
  ({
    domain: MODEL_CHALLENGE_DOMAIN,
    types: modelChallengeTypes,
    primaryType: "ModelChallenge",
    message: {
      purpose: MODEL_CHALLENGE_PURPOSE,
      wallet: getAddress(message.wallet) as Address,
      receiptId: message.receiptId,
      evidenceHash: message.evidenceHash
    }
  }) satisfies TypedDataDefinition<typeof modelChallengeTypes, "ModelChallenge">

/** The EIP-712 digest: what makes a filing unique (a signed filing opens at most one challenge). */
export const modelChallengeDigest = (message: ModelChallengeMessage) =>
  hashTypedData(modelChallengeTypedData(message))
