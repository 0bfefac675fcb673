import { Schema } from "effect"

/** One settlement rail the caller may pay on (spec 2.7, plus the x402 v2 names). */
export const PaymentRequirements = Schema.Struct({
  scheme: Schema.Literals(["exact", "upto"]),
  network: Schema.String,
  /** Spec 2.7 name of the worst case. */
  maxAmountRequired: Schema.String,
  /** x402 v2 name of the same amount; the official client refuses a requirement without it. */
  amount: Schema.String,
  payTo: Schema.String,
  asset: Schema.String,
  maxTimeoutSeconds: Schema.Int,
  /** The token's EIP-712 domain, which the official client needs to sign. */
  extra: Schema.Struct({ name: Schema.String, version: Schema.String })
})
export type PaymentRequirements = typeof PaymentRequirements.Type

export const PaymentRequiredCode = Schema.Literals([
  "payment_required",
  "solo_settle_floor",
  "payment_limit",
  "payment_verification_unavailable",
  "session_dead",
  "payment_invalid",
  "wrong_scheme",
  "key_unfunded",
  "key_budget_exhausted",
  "session_budget_exhausted"
])
export type PaymentRequiredCode = typeof PaymentRequiredCode.Type

export const PaymentResource = Schema.Struct({
  url: Schema.String,
  description: Schema.optionalKey(Schema.String),
  mimeType: Schema.optionalKey(Schema.String)
})

/** 402: the body of spec 2.7; its base64 form also travels in the `PAYMENT-REQUIRED` header. */
export class PaymentRequired extends Schema.TaggedError<PaymentRequired>()(
  "PaymentRequired",
  {
    x402Version: Schema.Literal(2),
    error: Schema.String,
    resource: PaymentResource,
    accepts: Schema.Array(PaymentRequirements),
    credits: Schema.Struct({
      header: Schema.String,
      required: Schema.String,
      unit: Schema.String,
      note: Schema.String
    }),
    code: Schema.optionalKey(PaymentRequiredCode),
    hint: Schema.optionalKey(Schema.String),
    session_required: Schema.optionalKey(Schema.Boolean),
    floor: Schema.optionalKey(Schema.String),
    retryable: Schema.optionalKey(Schema.Boolean)
  },
  { httpApiStatus: 402 }
) {}
