import { Schema } from "effect"
import type { PaymentRequired } from "./X402.ts"

/**
 * Every failure a caller can cause, each carrying its HTTP status. Bodies are rendered in
 * the caller's dialect by `http/ErrorWire.ts`; the fields here are dialect-neutral:
 * a human `message`, a machine `code`, and the offending `param` when there is one.
 */
const fields = {
  message: Schema.String,
  code: Schema.String,
  param: Schema.optionalKey(Schema.String)
}

export class InvalidRequest extends Schema.TaggedError<InvalidRequest>()("InvalidRequest", fields, {
  httpApiStatus: 400
}) {}

/** Vendor-native hosted tools (computer use, hosted browsing) fail closed; local function tools work. */
export class CapabilityUnsupported extends Schema.TaggedError<CapabilityUnsupported>()(
  "CapabilityUnsupported",
  fields,
  { httpApiStatus: 400 }
) {}

export class Unauthorized extends Schema.TaggedError<Unauthorized>()("Unauthorized", fields, {
  httpApiStatus: 401
}) {}

export class Forbidden extends Schema.TaggedError<Forbidden>()("Forbidden", fields, { httpApiStatus: 403 }) {}

/** Launch-gated features answer before any payment or provider work (docs/decisions.md: 403). */
export class FeatureGated extends Schema.TaggedError<FeatureGated>()("FeatureGated", fields, {
  httpApiStatus: 403
}) {}

export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", fields, { httpApiStatus: 404 }) {}

export const ConflictCode = Schema.Literals([
  "idempotency_replay",
  "session_used",
  "context_busy",
  "quote_id_reused",
  "conflict",
  // points and the model-integrity program (docs/decisions.md D63, D65, D67)
  "reward_already_claimed",
  "receipt_already_challenged",
  "challenge_replayed",
  "challenge_not_open",
  "claim_stale",
  "setup_already_decided",
  // durable tasks (docs/decisions.md D137, D138, D143)
  "lease_held",
  "lease_lost",
  "lease_expired",
  "stale_fence",
  "effect_resolved",
  "acceptance_frozen",
  // routing feedback (docs/decisions.md D129)
  "feedback_already_recorded"
])
export class Conflict extends Schema.TaggedError<Conflict>()(
  "Conflict",
  { message: Schema.String, code: ConflictCode, param: Schema.optionalKey(Schema.String) },
  { httpApiStatus: 409 }
) {}

export class PayloadTooLarge extends Schema.TaggedError<PayloadTooLarge>()("PayloadTooLarge", fields, {
  httpApiStatus: 413
}) {}

export class UnsupportedMediaType extends Schema.TaggedError<UnsupportedMediaType>()(
  "UnsupportedMediaType",
  fields,
  { httpApiStatus: 415 }
) {}

export class UpstreamFailed extends Schema.TaggedError<UpstreamFailed>()("UpstreamFailed", fields, {
  httpApiStatus: 502
}) {}

export class ServiceUnavailable extends Schema.TaggedError<ServiceUnavailable>()(
  "ServiceUnavailable",
  fields,
  {
    httpApiStatus: 503
  }
) {}

export const gated = (feature: string) =>
  new FeatureGated({
    code: "feature_gated",
    param: feature,
    message: `${feature} is not enabled at launch; no payment was taken and no provider was called`
  })

/** The errors rendered in the OpenAI and Anthropic conventions (402 has its own x402 body). */
export const DialectErrors = [
  InvalidRequest,
  CapabilityUnsupported,
  Unauthorized,
  Forbidden,
  FeatureGated,
  NotFound,
  Conflict,
  PayloadTooLarge,
  UnsupportedMediaType,
  UpstreamFailed,
  ServiceUnavailable
] as const
export type DialectError = InstanceType<(typeof DialectErrors)[number]>

/** OpenAI `error.type` / Anthropic `error.type` for each error. */
export const errorTypes: Record<
  DialectError["_tag"],
  { readonly openai: string; readonly anthropic: string }
> = {
  InvalidRequest: { openai: "invalid_request_error", anthropic: "invalid_request_error" },
  CapabilityUnsupported: { openai: "invalid_request_error", anthropic: "invalid_request_error" },
  Unauthorized: { openai: "authentication_error", anthropic: "authentication_error" },
  Forbidden: { openai: "permission_error", anthropic: "permission_error" },
  FeatureGated: { openai: "feature_gated", anthropic: "permission_error" },
  NotFound: { openai: "not_found_error", anthropic: "not_found_error" },
  Conflict: { openai: "conflict_error", anthropic: "invalid_request_error" },
  PayloadTooLarge: { openai: "invalid_request_error", anthropic: "request_too_large" },
  UnsupportedMediaType: { openai: "invalid_request_error", anthropic: "invalid_request_error" },
  UpstreamFailed: { openai: "upstream_error", anthropic: "api_error" },
  ServiceUnavailable: { openai: "service_unavailable", anthropic: "overloaded_error" }
}

/** Every way a paid call (any dialect, images included) can fail, each with its status. */
export type PaidCallError =
  | Conflict
  | Unauthorized
  | Forbidden
  | InvalidRequest
  | CapabilityUnsupported
  | FeatureGated
  | NotFound
  | PaymentRequired
  | ServiceUnavailable
  | UpstreamFailed
