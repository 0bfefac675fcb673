import { Schema, SchemaTransformation } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import { DeviceFlowError, DeviceFlowErrorCode, SetupStatus } from "../setup/DeviceFlow.ts"
import { Harness } from "../setup/Harness.ts"
import { openAi } from "./ErrorWire.ts"

const Address = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]{40}$/, { message: "expected a 0x-prefixed 20-byte address" })
)

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
  wallet: Schema.optionalKey(Address),
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
}).pipe(HttpApiSchema.status(201))

export const ApproveSetupRequest = Schema.Struct({
  wallet: Address,
  /** Base units; at most the budget asked. */
  budget: Schema.Int.check(Schema.isGreaterThan(0)),
  signature: Schema.String.check(Schema.isPattern(/^0x[0-9a-fA-F]+$/, { message: "expected 0x hex" }))
})

/** RFC 8628 section 3.4. Every field optional here so that a missing one is an OAuth `invalid_request`. */
export const TokenRequest = Schema.Struct({
  grant_type: Schema.optionalKey(Schema.String),
  device_code: Schema.optionalKey(Schema.String),
  client_id: Schema.optionalKey(Schema.String)
})

/** RFC 6749 section 5.1 token response, the token being a credit key sent as `x-credit-key`. */
export const TokenIssued = HttpApiSchema.WithHeaders(
  Schema.Struct({
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
  }),
  { "cache-control": Schema.Literal("no-store") }
)

const OAuthErrorBody = Schema.Struct({ error: DeviceFlowErrorCode, error_description: Schema.String })

/** The token endpoint answers in the OAuth convention, `{ error, error_description }` (docs/decisions.md). */
export const DeviceFlowErrorWire = OAuthErrorBody.pipe(
  Schema.decodeTo(
    DeviceFlowError,
    SchemaTransformation.transform({
      decode: (body) => ({ _tag: "DeviceFlowError" as const, ...body }),
      encode: ({ error, error_description }) => ({ error, error_description })
    })
  ),
  HttpApiSchema.status(400)
)

const UserCodeParam = { code: Schema.String }

/** Device-flow setup of a coding agent's spend key (spec 4.5 `/v1/agent-setup/*`, RFC 8628). */
export class AgentSetupApi extends HttpApiGroup.make("agentSetup").add(
  HttpApiEndpoint.post("startSetup", "/v1/agent-setup/sessions", {
    payload: StartSetupRequest,
    success: SetupStarted,
    error: openAi(InvalidRequest)
  }),
  HttpApiEndpoint.get("viewSetup", "/v1/agent-setup/sessions/:code", {
    params: UserCodeParam,
    success: SetupView,
    error: [openAi(InvalidRequest), openAi(NotFound)]
  }),
  HttpApiEndpoint.post("approveSetup", "/v1/agent-setup/sessions/:code/approve", {
    params: UserCodeParam,
    payload: ApproveSetupRequest,
    success: SetupView,
    error: [
      openAi(InvalidRequest),
      openAi(Unauthorized),
      openAi(Forbidden),
      openAi(NotFound),
      openAi(Conflict)
    ]
  }),
  HttpApiEndpoint.post("denySetup", "/v1/agent-setup/sessions/:code/deny", {
    params: UserCodeParam,
    success: SetupView,
    error: [openAi(InvalidRequest), openAi(NotFound), openAi(Conflict)]
  }),
  HttpApiEndpoint.post("exchangeToken", "/v1/agent-setup/token", {
    payload: [TokenRequest, TokenRequest.pipe(HttpApiSchema.asFormUrlEncoded())],
    success: TokenIssued,
    error: DeviceFlowErrorWire
  })
) {}

/**
 * The page may run only its own script, talk only to this router, and never be framed (an approval page
 * inside another site's frame could be dressed up to mislead the wallet holder).
 */
export const APPROVAL_PAGE_POLICY =
  "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; " +
  "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

/** The approval page at a setup's verification URI: HTML and its script. */
export class AgentSetupPageApi extends HttpApiGroup.make("agentSetupPage").add(
  HttpApiEndpoint.get("approvalPage", "/setup", {
    success: HttpApiSchema.WithHeaders(
      Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/html; charset=utf-8" })),
      {
        "content-security-policy": Schema.Literal(APPROVAL_PAGE_POLICY),
        "x-frame-options": Schema.Literal("DENY"),
        "referrer-policy": Schema.Literal("no-referrer")
      }
    )
  }),
  HttpApiEndpoint.get("approvalScript", "/setup/approve.js", {
    success: Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/javascript; charset=utf-8" }))
  })
) {}
