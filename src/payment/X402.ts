import { Config, Context, Effect, Layer, Result, Schema, SchemaIssue } from "effect"
import type { Address } from "viem"
import type { TokenDomain } from "../chain/Eip3009.ts"
import {
  ExactPayload,
  type ExactPayment,
  FlatEnvelopeHead,
  NestedEnvelopeHead,
  PaymentRequired,
  type PaymentRequiredCode,
  type PaymentRequirements,
  UptoPayload,
  type UptoPayment
} from "../domain/X402.ts"

export type { ExactPayment, UptoPayment }

/** Everything a 402 quote and the `exact` checks need: the rail (from `Chain`) and the limits (from config). */
export interface X402Settings {
  readonly network: string
  /** The token contract: the EIP-712 verifying contract of every authorization. */
  readonly asset: Address
  /** The treasury: the only `to` an authorization may name. */
  readonly payTo: Address
  readonly tokenDomain: TokenDomain
  readonly maxTimeoutSeconds: number
  /** `upto`: the router signer, the only facilitator a witness may name (it sends the settlement). */
  readonly facilitator: Address
  /** `upto`: the x402 upto proxy, the spender Permit2 sees. */
  readonly uptoProxy: Address
  /** `upto`: the `maxTimeoutSeconds` of its `accepts` entry; the official client signs `deadline = now + it`. */
  readonly uptoTimeoutSeconds: number
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

/** Spec 5.2: an `upto` deadline lies at least 30 minutes... */
export const UPTO_MIN_DEADLINE_S = 1800
/** ...and at most 2 hours ahead. */
export const UPTO_MAX_DEADLINE_S = 7200

export interface X402Limits {
  readonly soloSettleFloor: number
  readonly paymentCap: number
  readonly maxTimeoutSeconds: number
  readonly uptoTimeoutSeconds: number
}

const defaultLimits: X402Limits = {
  soloSettleFloor: 10_000,
  paymentCap: 50_000_000,
  maxTimeoutSeconds: 300,
  // The SDK's 60 minutes (spec 5.2).
  uptoTimeoutSeconds: 3600
}

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
      // ...and `deadline = now + maxTimeoutSeconds` for `upto`: that one must fit the upto window.
      const uptoTimeoutSeconds = yield* Config.schema(
        Schema.Int.check(
          Schema.isGreaterThanOrEqualTo(UPTO_MIN_DEADLINE_S),
          Schema.isLessThanOrEqualTo(UPTO_MAX_DEADLINE_S)
        ),
        "UPTO_TIMEOUT_SECONDS"
      ).pipe(Config.withDefault(defaultLimits.uptoTimeoutSeconds))
      return X402Config.of({ soloSettleFloor, paymentCap, maxTimeoutSeconds, uptoTimeoutSeconds })
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
  wrong_scheme: "Only the exact scheme is accepted here: sign accepts[0] and retry; nothing was charged.",
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
  /**
   * Whether this surface takes `upto` too (per-turn completions, spec 5.2): `accepts` then lists
   * `exact` first (so a client that takes the first entry pays as before) and `upto` second.
   */
  readonly upto?: boolean
}

const uptoHints: Partial<Record<PaymentRequiredCode, string>> = {
  payment_required:
    "Sign an accepts entry (exact: EIP-3009 TransferWithAuthorization; upto: a Permit2 witness transfer of at most the amount, the metered actual settled) and retry the same request with PAYMENT-SIGNATURE.",
  payment_invalid: "Sign an accepts entry again and retry the same request with the new PAYMENT-SIGNATURE.",
  wrong_scheme: "Sign the exact or the upto entry of accepts and retry; nothing was charged."
}

/** The `accepts` entries of a surface: `exact`, and `upto` after it where the surface takes it. */
export const acceptsOf = (
  settings: X402Settings,
  amount: string,
  upto: boolean
): ReadonlyArray<PaymentRequirements> => {
  const exact: PaymentRequirements = {
    scheme: "exact",
    network: settings.network,
    maxAmountRequired: amount,
    amount,
    payTo: settings.payTo,
    asset: settings.asset,
    maxTimeoutSeconds: settings.maxTimeoutSeconds,
    extra: { name: settings.tokenDomain.name, version: settings.tokenDomain.version }
  }
  if (!upto) return [exact]
  return [
    exact,
    {
      ...exact,
      scheme: "upto",
      maxTimeoutSeconds: settings.uptoTimeoutSeconds,
      extra: { ...exact.extra, facilitatorAddress: settings.facilitator }
    }
  ]
}

/** The 402 of spec 2.7, its `accepts` entries also readable by the official x402 v2 client. */
export const paymentRequired = (input: PaymentRequiredInput): PaymentRequired => {
  const { settings, worstCase } = input
  const overCap = worstCase > settings.paymentCap
  const code: PaymentRequiredCode = overCap ? "payment_limit" : (input.code ?? "payment_required")
  const error = overCap
    ? `the worst case of ${worstCase} base units exceeds the payment cap of ${settings.paymentCap}`
    : input.error
  const amount = String(quoteAmount(worstCase, settings))
  const floorRequired = code === "solo_settle_floor"
  const upto = input.upto === true
  const hint =
    (overCap ? undefined : input.hint) ?? (upto ? uptoHints[code] : undefined) ?? defaultHints[code]
  return new PaymentRequired({
    x402Version: 2,
    error,
    resource: { url: input.resourceUrl, description: input.description, mimeType: "application/json" },
    accepts: acceptsOf(settings, amount, upto),
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
 * network, payload}`, of an `exact` payment or (where `schemes` has it) an `upto` one. The version and
 * scheme are read before the payload so that an envelope of a scheme the surface does not take (whose
 * payload has another shape) is reported as that scheme, not as malformed.
 */
export const decodePaymentSignature = (
  headerValue: string,
  /** The schemes the surface takes: `upto` only on per-turn completions (spec 5.2). */
  schemes: ReadonlyArray<"exact" | "upto"> = ["exact", "upto"]
): Result.Result<ExactPayment | UptoPayment, PaymentEnvelopeError> => {
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
  if (scheme === "upto" && !schemes.includes("upto")) {
    return Result.fail(
      new PaymentEnvelopeError({
        reason: "unsupported_scheme",
        message:
          "the upto scheme is not accepted here (sessions, top-ups, images and deposits take exact only); sign accepts[0]"
      })
    )
  }
  if (scheme === "upto") {
    const upto = Schema.decodeUnknownResult(UptoPayload)(envelope, { errors: "all" })
    if (Result.isFailure(upto))
      return malformed(`malformed upto payload: ${describeIssue(upto.failure.issue)}`)
    const { permit2Authorization, signature } = upto.success.payload
    return Result.succeed({
      scheme: "upto",
      network,
      asset,
      payTo,
      authorization: permit2Authorization,
      signature
    })
  }
  if (scheme !== "exact") {
    return Result.fail(
      new PaymentEnvelopeError({
        reason: "unsupported_scheme",
        message: `the ${JSON.stringify(scheme.slice(0, 32))} scheme is not accepted here; sign an accepts entry`
      })
    )
  }
  const body = Schema.decodeUnknownResult(ExactPayload)(envelope, { errors: "all" })
  if (Result.isFailure(body))
    return malformed(`malformed exact payload: ${describeIssue(body.failure.issue)}`)
  const { authorization, signature } = body.success.payload
  return Result.succeed({ scheme: "exact", network, asset, payTo, authorization, signature })
}
