import { type Effect, Schema } from "effect"

const ClassId = Schema.String.check(Schema.isPattern(/^[A-Za-z0-9._:-]{1,128}$/))
const Price = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

export const Capabilities = Schema.Struct({
  tools: Schema.Boolean,
  reasoning: Schema.Boolean,
  vision: Schema.Boolean,
  json: Schema.Boolean
})
export type Capabilities = typeof Capabilities.Type
export type Capability = keyof Capabilities

export const CAPABILITIES: ReadonlyArray<Capability> = ["tools", "reasoning", "vision", "json"]

/**
 * The phantom reserve: the most the router will clear a class at, in base units per 1M tokens.
 * It acts as a phantom rival bid, so a lone quote clears here rather than at its own ask.
 */
export const ReserveTariff = Schema.Struct({ price_in: Price, price_out: Price })
export type ReserveTariff = typeof ReserveTariff.Type

export const ModelClass = Schema.Struct({
  id: ClassId,
  quality: Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 })),
  capabilities: Capabilities,
  max_context: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  reserve: Schema.optionalKey(ReserveTariff),
  description: Schema.String
})
export type ModelClass = typeof ModelClass.Type

export const Catalog = Schema.Array(ModelClass).check(
  Schema.makeFilter((classes) => {
    const seen = new Set<string>()
    for (const modelClass of classes) {
      if (seen.has(modelClass.id)) return `duplicate model class id ${modelClass.id}`
      seen.add(modelClass.id)
    }
    return undefined
  }),
  Schema.isMinLength(1)
)
export type Catalog = typeof Catalog.Type

const all: Capabilities = { tools: true, reasoning: true, vision: true, json: true }

/**
 * The default classes. Reserves sit above the simulated fleet's typical asks (about 60-90% of the reserve)
 * so the reserve only binds when competition is thin.
 */
/**
 * Text-to-image, one image per request. Image classes price per unit, not per token: `price_in`
 * per 1,000,000 prompts and `price_out` per 1,000,000 images, so the one billing function
 * charges a request as one prompt in and one image out. A `max_context` of 2 keeps image quotes
 * out of every chat auction (a chat request is never under 8 tokens).
 */
export const imageStandardClass: ModelClass = {
  id: "image-standard",
  quality: 0.7,
  capabilities: { tools: false, reasoning: false, vision: false, json: false },
  max_context: 2,
  reserve: { price_in: 0, price_out: 50_000_000_000 },
  description:
    "Text-to-image, one image per request; price_in per 1,000,000 prompts, price_out per 1,000,000 images."
}

export const defaultCatalog: Catalog = [
  {
    id: "chat-large",
    quality: 0.9,
    capabilities: all,
    max_context: 128_000,
    reserve: { price_in: 3_000_000, price_out: 15_000_000 },
    description: "Frontier general chat model: tools, reasoning, vision, JSON."
  },
  {
    id: "chat-medium",
    quality: 0.75,
    capabilities: { tools: true, reasoning: false, vision: true, json: true },
    max_context: 128_000,
    reserve: { price_in: 1_000_000, price_out: 4_000_000 },
    description: "Mid-size general chat model: tools, vision, JSON."
  },
  {
    id: "chat-small",
    quality: 0.55,
    capabilities: { tools: true, reasoning: false, vision: false, json: true },
    max_context: 32_000,
    reserve: { price_in: 300_000, price_out: 1_200_000 },
    description: "Small, fast, cheap chat model: tools, JSON; no vision."
  },
  {
    id: "reasoning-large",
    quality: 0.95,
    capabilities: { tools: true, reasoning: true, vision: false, json: true },
    max_context: 200_000,
    reserve: { price_in: 6_000_000, price_out: 24_000_000 },
    description: "Large reasoning model with extended thinking: tools, JSON."
  },
  {
    id: "grounded-medium",
    quality: 0.7,
    capabilities: { tools: true, reasoning: false, vision: false, json: true },
    max_context: 128_000,
    reserve: { price_in: 1_500_000, price_out: 6_000_000 },
    description: "Mid-size model whose providers ground answers in web search and return sources."
  },
  imageStandardClass
]

/**
 * Decodes a catalog override (the value of `MODEL_CATALOG_JSON`): a JSON string or an already parsed
 * array of classes. An override replaces the default catalog as a whole.
 */
export const decodeCatalog = (json: unknown): Effect.Effect<Catalog, Schema.SchemaError> =>
  typeof json === "string"
    ? Schema.decodeUnknownEffect(Schema.fromJsonString(Catalog))(json)
    : Schema.decodeUnknownEffect(Catalog)(json)

export const findClass = (catalog: Catalog, id: string): ModelClass | undefined =>
  catalog.find((modelClass) => modelClass.id === id)

/** The required capabilities the class lacks, in catalog order (empty when it has them all). */
export const missingCapabilities = (
  modelClass: ModelClass,
  required: ReadonlyArray<Capability>
): ReadonlyArray<Capability> =>
  CAPABILITIES.filter((c) => required.includes(c) && !modelClass.capabilities[c])
