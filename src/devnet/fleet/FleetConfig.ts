import { keccak256, toHex } from "viem"
import { type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts"
import type { DialectName } from "./Dialect.ts"
import type { SimFaults } from "./ProviderServer.ts"

/** The model class ids the catalog uses. */
export type ModelClassId =
  | "chat-large"
  | "chat-medium"
  | "chat-small"
  | "reasoning-large"
  | "grounded-medium"
  | "image-standard"

export interface Tariff {
  /** Base units per 1,000,000 input tokens. */
  readonly priceIn: number
  /** Base units per 1,000,000 output tokens. */
  readonly priceOut: number
}

/** Ceilings the simulated asks never cross (the catalog's reserves are at or above these). */
export const classReserves: Readonly<Record<ModelClassId, Tariff>> = {
  "chat-large": { priceIn: 3_000_000, priceOut: 15_000_000 },
  "chat-medium": { priceIn: 1_000_000, priceOut: 4_000_000 },
  "chat-small": { priceIn: 200_000, priceOut: 800_000 },
  "reasoning-large": { priceIn: 5_000_000, priceOut: 20_000_000 },
  "grounded-medium": { priceIn: 1_500_000, priceOut: 5_000_000 },
  // An image class prices one image as one output unit, per 1,000,000 (docs/decisions.md):
  // 50,000,000,000 per million images is 50,000 base units (0.05) an image; prompts are free.
  "image-standard": { priceIn: 0, priceOut: 50_000_000_000 }
}

export interface ClassOffer extends Tariff {
  readonly modelClass: ModelClassId
  /** Session tariff: both present or both absent. */
  readonly session?: { readonly priceInCached: number; readonly sessionTtlS: number } | undefined
}

export interface ProviderConfig {
  readonly providerId: string
  readonly dialect: DialectName
  readonly offers: ReadonlyArray<ClassOffer>
  readonly ttftMs: number
  readonly tokensPerSecond: number
  readonly capacityRps: number
  readonly maxContext: number
  readonly faults?: SimFaults | undefined
}

/** A simulation-only key derived from the provider id; never use outside the devnet. */
export const simulationAccount = (providerId: string): PrivateKeyAccount =>
  privateKeyToAccount(keccak256(toHex(`svc-sim-provider:${providerId}`)))

export const defaultFleet: ReadonlyArray<ProviderConfig> = [
  {
    providerId: "sim-openai-1",
    dialect: "openai",
    offers: [
      {
        modelClass: "chat-large",
        priceIn: 2_500_000,
        priceOut: 10_000_000,
        session: { priceInCached: 1_250_000, sessionTtlS: 300 }
      },
      {
        modelClass: "chat-medium",
        priceIn: 600_000,
        priceOut: 2_400_000,
        session: { priceInCached: 150_000, sessionTtlS: 600 }
      }
    ],
    ttftMs: 350,
    tokensPerSecond: 90,
    capacityRps: 16,
    maxContext: 128_000
  },
  {
    providerId: "sim-openai-2",
    dialect: "openai",
    offers: [
      { modelClass: "chat-medium", priceIn: 750_000, priceOut: 3_000_000 },
      { modelClass: "chat-small", priceIn: 150_000, priceOut: 600_000 }
    ],
    ttftMs: 220,
    tokensPerSecond: 140,
    capacityRps: 24,
    maxContext: 128_000
  },
  {
    providerId: "sim-openai-3",
    dialect: "openai",
    offers: [
      {
        modelClass: "reasoning-large",
        priceIn: 4_000_000,
        priceOut: 16_000_000,
        session: { priceInCached: 1_000_000, sessionTtlS: 600 }
      }
    ],
    ttftMs: 900,
    tokensPerSecond: 60,
    capacityRps: 8,
    maxContext: 200_000
  },
  {
    providerId: "sim-openai-4",
    dialect: "openai",
    offers: [{ modelClass: "chat-small", priceIn: 100_000, priceOut: 400_000 }],
    ttftMs: 150,
    tokensPerSecond: 200,
    capacityRps: 32,
    maxContext: 32_000
  },
  {
    providerId: "sim-grounded-1",
    dialect: "openai",
    offers: [{ modelClass: "grounded-medium", priceIn: 1_200_000, priceOut: 4_500_000 }],
    ttftMs: 600,
    tokensPerSecond: 80,
    capacityRps: 8,
    maxContext: 128_000
  },
  {
    providerId: "sim-anthropic-1",
    dialect: "anthropic",
    offers: [
      {
        modelClass: "chat-large",
        priceIn: 2_800_000,
        priceOut: 14_000_000,
        session: { priceInCached: 280_000, sessionTtlS: 300 }
      },
      { modelClass: "reasoning-large", priceIn: 4_500_000, priceOut: 18_000_000 }
    ],
    ttftMs: 450,
    tokensPerSecond: 70,
    capacityRps: 12,
    maxContext: 200_000
  },
  {
    providerId: "sim-anthropic-2",
    dialect: "anthropic",
    offers: [
      {
        modelClass: "chat-medium",
        priceIn: 900_000,
        priceOut: 3_800_000,
        session: { priceInCached: 225_000, sessionTtlS: 900 }
      },
      { modelClass: "chat-large", priceIn: 2_200_000, priceOut: 11_000_000 }
    ],
    ttftMs: 300,
    tokensPerSecond: 100,
    capacityRps: 16,
    maxContext: 200_000
  },
  {
    providerId: "sim-image-1",
    dialect: "openai",
    offers: [{ modelClass: "image-standard", priceIn: 0, priceOut: 40_000_000_000 }],
    ttftMs: 400,
    tokensPerSecond: 100,
    capacityRps: 8,
    maxContext: 4_096
  },
  {
    providerId: "sim-image-2",
    dialect: "openai",
    offers: [{ modelClass: "image-standard", priceIn: 0, priceOut: 44_000_000_000 }],
    ttftMs: 250,
    tokensPerSecond: 100,
    capacityRps: 8,
    maxContext: 4_096
  },
  {
    providerId: "sim-anthropic-3",
    dialect: "anthropic",
    offers: [{ modelClass: "grounded-medium", priceIn: 1_400_000, priceOut: 4_800_000 }],
    ttftMs: 700,
    tokensPerSecond: 75,
    capacityRps: 8,
    maxContext: 200_000
  }
]
