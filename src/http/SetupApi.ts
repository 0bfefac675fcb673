import { Schema, SchemaTransformation } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import {
  ApproveSetupRequest,
  DeviceFlowError,
  DeviceFlowErrorCode,
  SetupStarted,
  SetupView,
  StartSetupRequest,
  TokenIssued,
  TokenRequest
} from "../domain/Setup.ts"
import { openAi } from "./ErrorWire.ts"

/** Sent with the `cache-control: no-store` of RFC 6749 section 5.1. */
export const TokenIssuedWire = HttpApiSchema.WithHeaders(TokenIssued, {
  "cache-control": Schema.Literal("no-store")
})

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
    success: SetupStarted.pipe(HttpApiSchema.status(201)),
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
    success: TokenIssuedWire,
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
