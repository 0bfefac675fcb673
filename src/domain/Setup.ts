import { Schema } from "effect"
import { SignatureHex, WalletAddress } from "./Wire.ts"

/** The agent-setup wire (spec 4.5 `/v1/agent-setup/*`, RFC 8628): requests, views, the token and its errors. */

/** The coding-agent harnesses a setup can configure (`generic-openai`: any OpenAI-compatible client). */
export const HARNESSES = ["claude-code", "codex", "opencode", "aider", "generic-openai"] as const
export const Harness = Schema.Literals(HARNESSES)
export type Harness = typeof Harness.Type

/** How the approval page names each harness to the wallet holder. */
export const harnessNames: Record<Harness, string> = {
  "claude-code": "Claude Code",
  codex: "Codex CLI",
  opencode: "opencode",
  aider: "aider",
  "generic-openai": "an OpenAI-compatible client"
}

/** Where a setup stands; `expired` is read from the clock, never stored. */
export const SetupStatus = Schema.Literals(["pending", "approved", "denied", "exchanged", "expired"])
export type SetupStatus = typeof SetupStatus.Type

/** RFC 8628 section 3.4: the grant type a token request names (optional here; anything else is refused). */
export const DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"

/**
 * The token endpoint's errors, by their RFC 8628 (section 3.5) and RFC 6749 (section 5.2) names, so a
 * harness's existing device-flow client reads them without a mapping table.
 */
export const DeviceFlowErrorCode = Schema.Literals([
  "authorization_pending",
  "slow_down",
  "expired_token",
  "access_denied",
  "invalid_grant",
  "invalid_request",
  "unsupported_grant_type"
])
export type DeviceFlowErrorCode = typeof DeviceFlowErrorCode.Type

/** Every token-endpoint refusal: 400 with the OAuth body `{ error, error_description }`. */
export class DeviceFlowError extends Schema.TaggedError<DeviceFlowError>()(
  "DeviceFlowError",
  { error: DeviceFlowErrorCode, error_description: Schema.String },
  { httpApiStatus: 400 }
) {}

/** `POST /v1/agent-setup/sessions`: the harness and the terms asked (spec 4.5). No credential. */
export const StartSetupRequest = Schema.Struct({
  harness: Harness,
  /** The key's spending cap, a decimal USDC string such as "5" or "2.50". */
  budget_usdc: Schema.String,
  /** CAIP-2; defaults to the router's own network (the only one accepted). */
  network: Schema.optionalKey(Schema.String),
  /** Seconds from now until the issued key expires (default 30 days; 1 hour to 90 days). */
  key_expires_in: Schema.optionalKey(Schema.Int),
  /** Only this wallet may approve, when given. */
  wallet: Schema.optionalKey(WalletAddress),
  /** The issued key's label in the wallet's key list. */
  label: Schema.optionalKey(Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(100)))
})

const TypedDataField = Schema.Struct({ name: Schema.String, type: Schema.String })

/** The approval typed data for `eth_signTypedData_v4`; the page adds `message.wallet` (docs/protocol.md). */
export const ApprovalTypedData = Schema.Struct({
  domain: Schema.Struct({ name: Schema.String, version: Schema.String, chainId: Schema.Number }),
  types: Schema.Struct({
    EIP712Domain: Schema.Array(TypedDataField),
    AgentSetupApproval: Schema.Array(TypedDataField)
  }),
  primaryType: Schema.Literal("AgentSetupApproval"),
  message: Schema.Struct({
    setup: Schema.String,
    userCode: Schema.String,
    harness: Schema.String,
    network: Schema.String,
    budget: Schema.String,
    keyExpiresAt: Schema.String
  })
})

/** A setup's terms and state. Amounts in base units (with `_usdc` decimals), times in unix seconds. */
export const SetupView = Schema.Struct({
  object: Schema.Literal("agent_setup"),
  user_code: Schema.String,
  status: SetupStatus,
  harness: Harness,
  harness_name: Schema.String,
  label: Schema.String,
  network: Schema.String,
  chain_id: Schema.Number,
  budget: Schema.Number,
  budget_usdc: Schema.String,
  key_expires_at: Schema.Number,
  expires_at: Schema.Number,
  wallet: Schema.NullOr(Schema.String),
  approved_by: Schema.NullOr(Schema.String),
  approved_budget: Schema.NullOr(Schema.Number),
  approved_budget_usdc: Schema.NullOr(Schema.String),
  typed_data: ApprovalTypedData
})

/** RFC 8628 section 3.2 device authorization response, plus the terms as stored. */
export const SetupStarted = Schema.Struct({
  object: Schema.Literal("agent_setup_started"),
  device_code: Schema.String,
  user_code: Schema.String,
  verification_uri: Schema.String,
  verification_uri_complete: Schema.String,
  expires_in: Schema.Number,
  interval: Schema.Number,
  setup: SetupView
})

export const ApproveSetupRequest = Schema.Struct({
  wallet: WalletAddress,
  /** Base units; at most the budget asked. */
  budget: Schema.Int.check(Schema.isGreaterThan(0)),
  signature: SignatureHex
})

/** RFC 8628 section 3.4. Every field optional here so that a missing one is an OAuth `invalid_request`. */
export const TokenRequest = Schema.Struct({
  grant_type: Schema.optionalKey(Schema.String),
  device_code: Schema.optionalKey(Schema.String),
  client_id: Schema.optionalKey(Schema.String)
})

/** RFC 6749 section 5.1 token response, the token being a credit key sent as `x-credit-key`. */
export const TokenIssued = Schema.Struct({
  access_token: Schema.String,
  token_type: Schema.Literal("credit_key"),
  /** Seconds until the key expires. */
  expires_in: Schema.Number,
  header: Schema.Literal("x-credit-key"),
  key_id: Schema.String,
  wallet: Schema.String,
  label: Schema.String,
  budget: Schema.Number,
  budget_usdc: Schema.String,
  key_expires_at: Schema.Number
})
