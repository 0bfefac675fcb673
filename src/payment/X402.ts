import { Config, Context, Effect, Layer, Result, Schema, SchemaIssue } from "effect"
import type { Address } from "viem"
import type { TokenDomain } from "../chain/Eip3009.ts"
import {
  ExactPayload,
  type ExactPayment,
  FlatEnvelopeHead,
  NestedEnvelopeHead,
  PaymentRequired,
  type PaymentRequiredCode
} from "../domain/X402.ts"

export type { ExactPayment }

/** Everything a 402 quote and the `exact` checks need: the rail (from `Chain`) and the limits (from config). */
export interface X402Settings {
  readonly network: string
  /** The token contract: the EIP-712 verifying contract of every authorization. */
  readonly asset: Address
  /** The treasury: the only `to` an authorization may name. */
  readonly payTo: Address
  readonly tokenDomain: TokenDomain
  readonly maxTimeoutSeconds: number
  /** Base units: the smallest authorization worth its own settlement transaction. */
  readonly soloSettleFloor: number
  /** Base units: the largest worst case one direct payment may cover. */
  readonly paymentCap: number
}

/** Spec 8: payment validity checks allow 5 seconds of clock skew. */
export const PAYMENT_CLOCK_SKEW_S = 5
/** Spec 5.2: an `exact` authorization leaves at least this much broadcast runway... */
export const EXACT_MIN_RUNWAY_S = 120
/** ...and expires within 7 days. */
export const EXACT_MAX_VALIDITY_S = 7 * 24 * 3600

export interface X402Limits {
  readonly soloSettleFloor: number
  readonly paymentCap: number
  readonly maxTimeoutSeconds: number
}

const defaultLimits: X402Limits = { soloSettleFloor: 10_000, paymentCap: 50_000_000, maxTimeoutSeconds: 300 }

/** The payment limits of this deployment: `SOLO_SETTLE_FLOOR`, `PAYMENT_CAP`, `PAYMENT_TIMEOUT_SECONDS`. */
export class X402Config extends Context.Service<X402Config, X402Limits>()("router/payment/X402Config") {
  static readonly layer = Layer.effect(
    X402Config,
    Effect.gen(function* () {
      const nonNegative = (name: string, fallback: number) =>
        Config.schema(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)), name).pipe(
          Config.withDefault(fallback)
        )
      const soloSettleFloor = yield* nonNegative("SOLO_SETTLE_FLOOR", defaultLimits.soloSettleFloor)
      const paymentCap = yield* nonNegative("PAYMENT_CAP", defaultLimits.paymentCap)
      // The official client signs `validBefore = now + maxTimeoutSeconds`: the timeout must fit the exact window.
      const maxTimeoutSeconds = yield* Config.schema(
        Schema.Int.check(
          Schema.isGreaterThanOrEqualTo(EXACT_MIN_RUNWAY_S),
          Schema.isLessThanOrEqualTo(EXACT_MAX_VALIDITY_S)
        ),
        "PAYMENT_TIMEOUT_SECONDS"
      ).pipe(Config.withDefault(defaultLimits.maxTimeoutSeconds))
      return X402Config.of({ soloSettleFloor, paymentCap, maxTimeoutSeconds })
    })
  )

  static readonly layerTest = (overrides: Partial<X402Limits> = {}) =>
    Layer.succeed(X402Config, X402Config.of({ ...defaultLimits, ...overrides }))
}

/**
 * What the 402 asks the client to sign. An authorization below the solo settlement floor would cost more in
 * gas to settle on its own than it brings in, so a small worst case is rounded up to the floor: the client
 * signs the floor, the router charges the metered actual, and the overage is refunded at epoch close.
 */
export const quoteAmount = (worstCase: number, settings: Pick<X402Settings, "soloSettleFloor">): number =>
  Math.max(worstCase, settings.soloSettleFloor)

const defaultHints: Partial<Record<PaymentRequiredCode, string>> = {
  payment_required:
    "Sign accepts[0] (EIP-3009 TransferWithAuthorization) and retry the same request with PAYMENT-SIGNATURE.",
  payment_invalid: "Sign accepts[0] again and retry the same request with the new PAYMENT-SIGNATURE.",
  wrong_scheme: "Only the exact scheme is enabled here: sign accepts[0] and retry; nothing was charged.",
  payment_limit: "Lower max_tokens or split the request.",
  solo_settle_floor: "Open a session (routing.session_id) or pay with x-credit-key.",
  payment_verification_unavailable: "Retry the same signed payment after a short backoff."
}

export interface PaymentRequiredInput {
  readonly settings: X402Settings
  /** Base units: the most this request can cost. */
  readonly worstCase: number
  readonly resourceUrl: string
  readonly description: string
  /** Defaults to `payment_required`; a worst case above the cap is always `payment_limit`. */
  readonly code?: PaymentRequiredCode
  readonly error: string
  readonly hint?: string
  readonly retryable?: boolean
  readonly sessionRequired?: boolean
}

/** The 402 of spec 2.7, its one `accepts` entry also readable by the official x402 v2 client. */
export const paymentRequired = (input: PaymentRequiredInput): PaymentRequired => {
  const { settings, worstCase } = input
  const overCap = worstCase > settings.paymentCap
  const code: PaymentRequiredCode = overCap ? "payment_limit" : (input.code ?? "payment_required")
  const error = overCap
    ? `the worst case of ${worstCase} base units exceeds the payment cap of ${settings.paymentCap}`
    : input.error
  const amount = String(quoteAmount(worstCase, settings))
  const floorRequired = code === "solo_settle_floor"
  const hint = (overCap ? undefined : input.hint) ?? defaultHints[code]
  return new PaymentRequired({
    x402Version: 2,
    error,
    resource: { url: input.resourceUrl, description: input.description, mimeType: "application/json" },
    accepts: [
      {
        scheme: "exact",
        network: settings.network,
        maxAmountRequired: amount,
        amount,
        payTo: settings.payTo,
        asset: settings.asset,
        maxTimeoutSeconds: settings.maxTimeoutSeconds,
        extra: { name: settings.tokenDomain.name, version: settings.tokenDomain.version }
      }
    ],
    credits: {
      header: "x-credit-key",
      required: String(worstCase),
      unit: "base units of USDC (6 decimals)",
      note: "A funded key sent in x-credit-key pays from its balance instead: the worst case is reserved and the unused part released."
    },
    code,
    ...(hint === undefined ? {} : { hint }),
    ...(floorRequired || input.sessionRequired === true ? { session_required: true } : {}),
    ...(floorRequired ? { floor: String(settings.soloSettleFloor) } : {}),
    ...(input.retryable === undefined ? {} : { retryable: input.retryable })
  })
}

/**
 * Why a `PAYMENT-SIGNATURE` header could not be read. `unsupported_scheme` is a well-formed envelope for a
 * scheme this deployment does not take. Messages name fields, never their values.
 */
export class PaymentEnvelopeError extends Schema.TaggedError<PaymentEnvelopeError>()("PaymentEnvelopeError", {
  reason: Schema.Literals(["malformed", "unsupported_version", "unsupported_scheme"]),
  message: Schema.String
}) {}

const MAX_HEADER_CHARS = 16_384

const describeIssue = (issue: SchemaIssue.Issue): string =>
  SchemaIssue.makeFormatterStandardSchemaV1()(issue)
    .issues.slice(0, 3)
    .map(({ path = [], message }) =>
      path.length === 0 ? message : `${path.map(String).join(".")}: ${message}`
    )
    .join("; ")

const malformed = (message: string) => Result.fail(new PaymentEnvelopeError({ reason: "malformed", message }))

const parseJson = (text: string): Result.Result<unknown, PaymentEnvelopeError> =>
  Result.try({
    try: (): unknown => JSON.parse(text),
    catch: () =>
      new PaymentEnvelopeError({ reason: "malformed", message: "PAYMENT-SIGNATURE is not base64 JSON" })
  })

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/**
 * Reads a `PAYMENT-SIGNATURE` header: base64 (standard or url-safe) of JSON, either the official v2 envelope
 * `{x402Version, accepted: {scheme, network, ...}, payload}` or the spec's flat `{x402Version, scheme,
 * network, payload}`. The version and scheme are read before the payload so that a well-formed envelope of
 * another scheme (whose payload has another shape) is reported as that scheme, not as malformed.
 */
export const decodePaymentSignature = (
  headerValue: string
): Result.Result<ExactPayment, PaymentEnvelopeError> => {
  const trimmed = headerValue.trim()
  if (trimmed.length === 0) return malformed("PAYMENT-SIGNATURE is empty")
  if (trimmed.length > MAX_HEADER_CHARS) return malformed("PAYMENT-SIGNATURE is too large")
  if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(trimmed)) return malformed("PAYMENT-SIGNATURE is not base64")
  const json = parseJson(Buffer.from(trimmed, "base64").toString("utf8"))
  if (Result.isFailure(json)) return Result.fail(json.failure)
  const envelope = json.success
  if (!isRecord(envelope)) return malformed("the payment envelope is not a JSON object")
  if (envelope.x402Version !== 2) {
    return Result.fail(
      new PaymentEnvelopeError({ reason: "unsupported_version", message: "x402Version must be 2" })
    )
  }
  const head =
    "accepted" in envelope
      ? Schema.decodeUnknownResult(NestedEnvelopeHead)(envelope).pipe(Result.map((nested) => nested.accepted))
      : Schema.decodeUnknownResult(FlatEnvelopeHead)(envelope)
  if (Result.isFailure(head))
    return malformed(`malformed payment envelope: ${describeIssue(head.failure.issue)}`)
  const { scheme, network, asset, payTo } = head.success
  if (scheme !== "exact") {
    return Result.fail(
      new PaymentEnvelopeError({
        reason: "unsupported_scheme",
        message: `the ${JSON.stringify(scheme.slice(0, 32))} scheme is not accepted here; sign the exact scheme`
      })
    )
  }
  const body = Schema.decodeUnknownResult(ExactPayload)(envelope, { errors: "all" })
  if (Result.isFailure(body))
    return malformed(`malformed exact payload: ${describeIssue(body.failure.issue)}`)
  const { authorization, signature } = body.success.payload
  return Result.succeed({ scheme: "exact", network, asset, payTo, authorization, signature })
}
