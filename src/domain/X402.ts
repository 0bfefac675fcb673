import { Schema, SchemaTransformation } from "effect"
import { type Address, getAddress, type Hex } from "viem"

/**
 * The x402 v2 wire (spec 2.7, 5.2; docs/protocol.md): the 402 body and its base64 twin in
 * `PAYMENT-REQUIRED`, the `PAYMENT-SIGNATURE` envelope of an `exact` payment (nested as the official
 * client sends it, or flat as the spec shows it) and of an `upto` payment (a Permit2 witness transfer,
 * docs/protocol.md section 6), and the `PAYMENT-RESPONSE` settle response.
 */

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
  /**
   * The token's EIP-712 domain, which the official client needs to sign; an `upto` entry also names the
   * facilitator (the router signer), which the official `upto` client signs into the witness.
   */
  extra: Schema.Struct({
    name: Schema.String,
    version: Schema.String,
    facilitatorAddress: Schema.optionalKey(Schema.String)
  })
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
  "session_budget_exhausted",
  // a paid call made for a durable task (docs/decisions.md D140)
  "task_budget_exhausted",
  "task_steps_exhausted",
  "task_closed"
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

const UINT256_MAX = 2n ** 256n - 1n

/** A uint256 as the envelope spells it: a decimal string (or, defensively, a safe integer). */
const Uint256 = Schema.Union([
  Schema.String.check(Schema.isPattern(/^\d{1,78}$/, { message: "expected a decimal string" })),
  // Numbers are accepted defensively; only safe integers, since a larger one has already lost precision.
  Schema.Number.check(
    Schema.isInt(),
    Schema.isGreaterThanOrEqualTo(0),
    Schema.isLessThanOrEqualTo(2 ** 53 - 1)
  )
]).pipe(
  Schema.decodeTo(
    Schema.BigInt.check(Schema.isLessThanOrEqualToBigInt(UINT256_MAX)),
    SchemaTransformation.transform<bigint, string | number>({
      decode: (value) => BigInt(value),
      encode: (value) => value.toString()
    })
  )
)

const HexString = (pattern: RegExp, message: string) =>
  Schema.TemplateLiteral(["0x", Schema.String]).check(Schema.isPattern(pattern, { message }))

/** Any letter case in, checksummed out: the checksum is a display convention, not part of the signed data. */
const EvmAddress = HexString(/^0x[0-9a-fA-F]{40}$/, "expected a 0x-prefixed 20-byte address").pipe(
  Schema.decodeTo(
    Schema.TemplateLiteral(["0x", Schema.String]),
    SchemaTransformation.transform<Address, Address>({
      decode: (value) => getAddress(value.toLowerCase()),
      encode: (value) => value
    })
  )
)
const Bytes32 = HexString(/^0x[0-9a-fA-F]{64}$/, "expected 32 bytes of 0x-prefixed hex")
const HexBytes = HexString(/^0x(?:[0-9a-fA-F]{2})+$/, "expected 0x-prefixed hex bytes")

/** The EIP-3009 `TransferWithAuthorization` an `exact` payment signs. */
export const ExactAuthorization = Schema.Struct({
  from: EvmAddress,
  to: EvmAddress,
  value: Uint256,
  validAfter: Uint256,
  validBefore: Uint256,
  nonce: Bytes32
})

/** The `payload` of an `exact` envelope. */
export const ExactPayload = Schema.Struct({
  payload: Schema.Struct({ authorization: ExactAuthorization, signature: HexBytes })
})

/** The Permit2 witness transfer an `upto` payment signs (`permit2Authorization` of the official client). */
export const UptoAuthorization = Schema.Struct({
  from: EvmAddress,
  permitted: Schema.Struct({ token: EvmAddress, amount: Uint256 }),
  spender: EvmAddress,
  nonce: Uint256,
  deadline: Uint256,
  witness: Schema.Struct({ to: EvmAddress, facilitator: EvmAddress, validAfter: Uint256 })
})

/** The `payload` of an `upto` envelope. */
export const UptoPayload = Schema.Struct({
  payload: Schema.Struct({ permit2Authorization: UptoAuthorization, signature: HexBytes })
})

/**
 * The rail a payment names. `asset` and `payTo` are echoed by the official client (under
 * `accepted`) and may be sent in the flat envelope; when present they are checked against the quote.
 */
const Rail = Schema.Struct({
  scheme: Schema.String,
  network: Schema.String,
  asset: Schema.optionalKey(Schema.String),
  payTo: Schema.optionalKey(Schema.String)
})
/** x402 v2 as the official client sends it: the chosen requirements echoed under `accepted`. */
export const NestedEnvelopeHead = Schema.Struct({ accepted: Rail })
/** Spec 2.7: `scheme` and `network` at the top level. */
export const FlatEnvelopeHead = Rail

/** The spec's flat `exact` envelope, as a client builds it (tests sign envelopes by hand with it). */
export const FlatExactEnvelope = Schema.Struct({
  x402Version: Schema.Literal(2),
  scheme: Schema.String,
  network: Schema.String,
  ...ExactPayload.fields
})

/** An `exact` payment as the router checks it, whichever envelope shape carried it. */
export interface ExactPayment {
  readonly scheme: "exact"
  readonly network: string
  /** The token the envelope names (`accepted.asset`), when it names one. */
  readonly asset?: string | undefined
  /** The recipient the envelope names (`accepted.payTo`), when it names one. */
  readonly payTo?: string | undefined
  readonly authorization: typeof ExactAuthorization.Type
  readonly signature: Hex
}

/** An `upto` payment as the router checks it: a ceiling, settled at the metered actual. */
export interface UptoPayment {
  readonly scheme: "upto"
  readonly network: string
  /** The token the envelope names (`accepted.asset`), when it names one. */
  readonly asset?: string | undefined
  /** The recipient the envelope names (`accepted.payTo`), when it names one. */
  readonly payTo?: string | undefined
  readonly authorization: typeof UptoAuthorization.Type
  readonly signature: Hex
}

const base64Json = (value: unknown) => Buffer.from(JSON.stringify(value)).toString("base64")

/** x402 v2 `PaymentRequired` as the official client reads it from the `PAYMENT-REQUIRED` header. */
export const paymentRequiredHeader = (body: Omit<PaymentRequired, "_tag">) =>
  base64Json({ x402Version: 2, error: body.error, resource: body.resource, accepts: body.accepts })

/** A flat `exact` envelope as its `PAYMENT-SIGNATURE` header. */
export const paymentSignatureHeader = (envelope: typeof FlatExactEnvelope.Type) =>
  base64Json(Schema.encodeSync(FlatExactEnvelope)(envelope))

/** Any base64-JSON x402 header (`PAYMENT-REQUIRED`, `PAYMENT-RESPONSE`, `PAYMENT-SIGNATURE`) read back. */
export const decodeX402Header = (value: string): unknown =>
  JSON.parse(Buffer.from(value, "base64").toString("utf8"))

/** `PAYMENT-RESPONSE` (x402 v2 `SettleResponse`), as its JSON reads. */
export const SettleResponse = Schema.Struct({
  success: Schema.Boolean,
  /** The settlement transaction hash, or "" when none was submitted. */
  transaction: Schema.String,
  network: Schema.String,
  payer: Schema.String,
  /** Base units actually charged, as a decimal string. */
  amount: Schema.String
})

export interface PaymentResponse {
  readonly success: boolean
  readonly transaction: string
  readonly network: string
  readonly payer: Address
  /** Base units actually charged. */
  readonly amount: bigint | number
}

/** The base64 `PAYMENT-RESPONSE` header of a paid reply. */
export const paymentResponseHeader = (response: PaymentResponse): string =>
  base64Json({
    success: response.success,
    transaction: response.transaction,
    network: response.network,
    payer: response.payer,
    amount: response.amount.toString()
  } satisfies typeof SettleResponse.Encoded)
