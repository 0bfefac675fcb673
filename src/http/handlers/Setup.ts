import { Effect } from "effect"
import { HttpApiBuilder, HttpApiSchema } from "effect/http-api"
import { InvalidRequest } from "../../domain/Errors.ts"
import { harnessNames } from "../../domain/Setup.ts"
import { formatUsdc, parseUsdc } from "../../payment/Keys.ts"
import { AgentSetups, type SetupView } from "../../setup/AgentSetups.ts"
import { approvalTypedData } from "../../setup/Approval.ts"
import { APPROVAL_PATH, ApprovalPage } from "../../setup/ApprovalPage.ts"
import { SetupSettings } from "../../setup/SetupSettings.ts"
import { Api } from "../Api.ts"
import { APPROVAL_PAGE_POLICY } from "../SetupApi.ts"

const setupView = (setup: SetupView) => ({
  object: "agent_setup" as const,
  user_code: setup.userCode,
  status: setup.status,
  harness: setup.harness,
  harness_name: harnessNames[setup.harness],
  label: setup.label,
  network: setup.network,
  chain_id: setup.chainId,
  budget: setup.budget,
  budget_usdc: formatUsdc(setup.budget),
  key_expires_at: setup.keyExpiresAt,
  expires_at: setup.expiresAt,
  wallet: setup.wallet,
  approved_by: setup.approvedBy,
  approved_budget: setup.approvedBudget,
  approved_budget_usdc: setup.approvedBudget === null ? null : formatUsdc(setup.approvedBudget),
  typed_data: approvalTypedData(setup, setup.chainId)
})

export const AgentSetupHandlers = HttpApiBuilder.group(
  Api,
  "agentSetup",
  Effect.fn(function* (handlers) {
    const setups = yield* AgentSetups
    const { publicUrl } = yield* SetupSettings
    return handlers
      .handle("startSetup", ({ payload }) =>
        Effect.gen(function* () {
          const budget = parseUsdc(payload.budget_usdc)
          if (budget === undefined || budget === 0) {
            return yield* new InvalidRequest({
              code: "invalid_budget",
              param: "budget_usdc",
              message:
                'budget_usdc must be a positive decimal string with at most 6 decimal places, e.g. "5.00"'
            })
          }
          const started = yield* setups.start({
            harness: payload.harness,
            budget,
            network: payload.network,
            keyExpiresIn: payload.key_expires_in,
            wallet: payload.wallet,
            label: payload.label
          })
          const verificationUri = `${publicUrl}${APPROVAL_PATH}`
          return {
            object: "agent_setup_started" as const,
            device_code: started.deviceCode,
            user_code: started.setup.userCode,
            verification_uri: verificationUri,
            verification_uri_complete: `${verificationUri}?code=${started.setup.userCode}`,
            expires_in: started.expiresIn,
            interval: started.intervalSeconds,
            setup: setupView(started.setup)
          }
        })
      )
      .handle("viewSetup", ({ params }) => Effect.map(setups.view(params.code), setupView))
      .handle("approveSetup", ({ params, payload }) =>
        Effect.map(setups.approve(params.code, payload), setupView)
      )
      .handle("denySetup", ({ params }) => Effect.map(setups.deny(params.code), setupView))
      .handle("exchangeToken", ({ payload }) =>
        Effect.map(
          setups.exchange({ grantType: payload.grant_type, deviceCode: payload.device_code }),
          (issued) =>
            HttpApiSchema.withHeaders({
              body: {
                access_token: issued.secret,
                token_type: "credit_key" as const,
                expires_in: issued.expiresIn,
                header: "x-credit-key" as const,
                key_id: issued.keyId,
                wallet: issued.wallet,
                label: issued.label,
                budget: issued.budget,
                budget_usdc: formatUsdc(issued.budget),
                key_expires_at: issued.keyExpiresAt
              },
              headers: { "cache-control": "no-store" as const }
            })
        )
      )
  })
)

export const AgentSetupPageHandlers = HttpApiBuilder.group(
  Api,
  "agentSetupPage",
  Effect.fn(function* (handlers) {
    const page = yield* ApprovalPage
    return handlers
      .handle("approvalPage", () =>
        Effect.succeed(
          HttpApiSchema.withHeaders({
            body: page.html,
            headers: {
              "content-security-policy": APPROVAL_PAGE_POLICY,
              "x-frame-options": "DENY" as const,
              "referrer-policy": "no-referrer" as const
            }
          })
        )
      )
      .handle("approvalScript", () => Effect.succeed(page.script))
  })
)
