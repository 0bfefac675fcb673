import Anthropic from "@anthropic-ai/sdk"
import { Effect, Layer, Redacted } from "effect"
import OpenAI from "openai"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import type { ProviderConfig } from "../../src/devnet/fleet/FleetConfig.ts"
import { payer, providerRequests, waitFor } from "../support/Pay.ts"
import { call, OPERATOR_TOKEN, RouterUrl, routerLayer } from "../support/Router.ts"

/**
 * A fleet where the class pins the dialect: `chat-medium` and `reasoning-large` are served
 * only by OpenAI-dialect providers, `chat-large` and `grounded-medium` only by
 * Anthropic-dialect ones. Two providers per class, so every auction has a runner-up.
 */
const fast = { ttftMs: 20, tokensPerSecond: 2_000, capacityRps: 64, maxContext: 200_000 }
export const dialectFleet: ReadonlyArray<ProviderConfig> = [
  {
    providerId: "sim-oa-1",
    dialect: "openai",
    offers: [
      { modelClass: "chat-medium", priceIn: 600_000, priceOut: 2_400_000 },
      { modelClass: "reasoning-large", priceIn: 4_000_000, priceOut: 16_000_000 }
    ],
    ...fast
  },
  {
    providerId: "sim-oa-2",
    dialect: "openai",
    offers: [
      { modelClass: "chat-medium", priceIn: 750_000, priceOut: 3_000_000 },
      { modelClass: "reasoning-large", priceIn: 4_500_000, priceOut: 18_000_000 }
    ],
    ...fast
  },
  {
    providerId: "sim-an-1",
    dialect: "anthropic",
    offers: [
      { modelClass: "chat-large", priceIn: 2_200_000, priceOut: 11_000_000 },
      { modelClass: "grounded-medium", priceIn: 1_200_000, priceOut: 4_500_000 }
    ],
    ...fast
  },
  {
    providerId: "sim-an-2",
    dialect: "anthropic",
    offers: [
      { modelClass: "chat-large", priceIn: 2_800_000, priceOut: 14_000_000 },
      { modelClass: "grounded-medium", priceIn: 1_400_000, priceOut: 4_800_000 }
    ],
    ...fast
  }
]

export const OPENAI_CLASS = "chat-medium"
export const ANTHROPIC_CLASS = "chat-large"
/** Reasoning-capable classes of each dialect. */
export const OPENAI_REASONING_CLASS = "reasoning-large"
export const ANTHROPIC_REASONING_CLASS = "chat-large"

export const dialects = [
  { dialect: "openai", model: OPENAI_CLASS, reasoningModel: OPENAI_REASONING_CLASS, prefix: "sim-oa-" },
  {
    dialect: "anthropic",
    model: ANTHROPIC_CLASS,
    reasoningModel: ANTHROPIC_REASONING_CLASS,
    prefix: "sim-an-"
  }
] as const

export const adaptersRouter = Layer.unwrap(
  Effect.gen(function* () {
    const router = routerLayer()
    const fleet = Layer.unwrap(
      Effect.map(RouterUrl, (url) =>
        Fleet.layer({
          routerUrl: url,
          operatorToken: Redacted.make(OPERATOR_TOKEN),
          refreshMs: 2_000,
          providers: dialectFleet
        })
      )
    )
    return fleet.pipe(Layer.provideMerge(router))
  })
)

export { providerRequests, waitFor }

const fleetClasses = ["chat-medium", "reasoning-large", "chat-large", "grounded-medium"]

export const waitForBook = waitFor(
  "the fleet's quotes",
  Effect.map(call("/v1/market/book"), (r) => {
    const classes = (r.json as { classes: Array<{ model_class?: string; id?: string; depth: number }> })
      .classes
    const ready = fleetClasses.every((id) =>
      classes.some((c) => (c.model_class ?? c.id) === id && c.depth >= 2)
    )
    return ready ? true : undefined
  })
)

/** The official SDKs, unmodified, paying with x402 through `@x402/fetch` (test/support/Pay.ts). */
export const sdkClients = Effect.gen(function* () {
  const base = yield* RouterUrl
  const { payingFetch } = yield* payer(0)
  return {
    base,
    openai: new OpenAI({ apiKey: "x402", baseURL: `${base}/v1`, fetch: payingFetch, maxRetries: 0 }),
    anthropic: new Anthropic({ apiKey: "x402", baseURL: base, fetch: payingFetch, maxRetries: 0 }),
    /** Without payment: what a caller sees before (or instead of) paying. */
    anthropicUnpaid: new Anthropic({ apiKey: "none", baseURL: base, maxRetries: 0 })
  }
})

/** The provider that served a request, from its receipt. */
export const servedBy = (requestId: string) =>
  waitFor(
    `receipt ${requestId}`,
    Effect.map(call(`/v1/receipts/${requestId}`), (r) =>
      r.status === 200
        ? (r.json as { receipt: { provider_id: string; charged: number; out_tokens: number } }).receipt
        : undefined
    )
  )

export interface SseEvent {
  readonly event: string | undefined
  readonly data: Record<string, unknown>
}

/** Parses a whole SSE body into `{event, data}` pairs (tests read the raw wire as well as the SDKs). */
export const parseSse = (text: string): ReadonlyArray<SseEvent> =>
  text
    .split("\n\n")
    .filter((block) => block.trim().length > 0)
    .map((block) => {
      const lines = block.split("\n")
      const event = lines.find((l) => l.startsWith("event: "))?.slice(7)
      const data = lines
        .filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6))
        .join("\n")
      return { event, data: JSON.parse(data) as Record<string, unknown> }
    })
