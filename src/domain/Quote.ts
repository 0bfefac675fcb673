import { Schema } from "effect"

/** Integer base units per 1,000,000 tokens (six-decimal stablecoin). */
export const PricePerMillion = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)).pipe(
  Schema.brand("PricePerMillion")
)
export type PricePerMillion = typeof PricePerMillion.Type

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const Id = Schema.String.check(Schema.isPattern(/^[A-Za-z0-9._:-]{1,128}$/))

/**
 * A provider's signed standing quote (spec 2.6). Wire field names are the spec's.
 * The signature is verified once, at ingest; the book keeps verified quotes only.
 */
export class SignedQuote extends Schema.Class<SignedQuote>("SignedQuote")({
  quote_id: Id,
  provider_id: Id,
  model_class: Id,
  price_in: PricePerMillion,
  price_out: PricePerMillion,
  max_context: PositiveInt,
  valid_until: NonNegativeInt,
  capacity_rps: PositiveInt,
  price_in_cached: Schema.optionalKey(PricePerMillion),
  session_ttl_s: Schema.optionalKey(NonNegativeInt),
  context_protocol: Schema.optionalKey(Schema.String),
  context_cache_ttl_s: Schema.optionalKey(NonNegativeInt),
  delta_handoff: Schema.optionalKey(Schema.Boolean),
  speculative: Schema.optionalKey(Schema.Boolean),
  speculative_cancel_ms: Schema.optionalKey(NonNegativeInt),
  sig: Schema.String.check(Schema.isPattern(/^0x[0-9a-fA-F]{130}$/))
}) {}

export type UnsignedQuote = Omit<SignedQuote, "sig">

const opt = (value: string | number | boolean | undefined): string =>
  value === undefined ? "" : String(value)

/**
 * The exact string a provider signs with EIP-191 personal_sign (docs/protocol.md).
 * Base fields in a fixed order; session fields only when both are present; the tagged
 * `context-v1` suffix only when any context field is present. Changing this order is a
 * breaking protocol change.
 */
export const quoteSigningString = (q: UnsignedQuote): string => {
  const base = [
    q.quote_id,
    q.provider_id,
    q.model_class,
    q.price_in,
    q.price_out,
    q.max_context,
    q.valid_until,
    q.capacity_rps
  ].join("|")
  const session =
    q.price_in_cached !== undefined && q.session_ttl_s !== undefined
      ? `|${q.price_in_cached}|${q.session_ttl_s}`
      : ""
  const hasContext =
    q.context_protocol !== undefined ||
    q.context_cache_ttl_s !== undefined ||
    q.delta_handoff !== undefined ||
    q.speculative !== undefined ||
    q.speculative_cancel_ms !== undefined
  const context = hasContext
    ? [
        "",
        "context-v1",
        opt(q.context_protocol),
        opt(q.context_cache_ttl_s),
        opt(q.delta_handoff),
        opt(q.speculative),
        opt(q.speculative_cancel_ms)
      ].join("|")
    : ""
  return base + session + context
}
