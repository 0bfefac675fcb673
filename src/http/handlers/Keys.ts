import { Effect, Schema, SchemaIssue } from "effect"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { InvalidRequest, Unauthorized } from "../../domain/Errors.ts"
import { Credits } from "../../payment/Credits.ts"
import { BASE_UNIT, formatUsdc, type KeyRecord, Keys, parseUsdc } from "../../payment/Keys.ts"
import { KeysAuth } from "../../payment/KeysAuth.ts"
import { Api } from "../Api.ts"
import { CreateKeyRequest } from "../KeysApi.ts"

const keyView = (record: KeyRecord) => ({
  id: record.keyId,
  object: "api_key" as const,
  label: record.label,
  kind: record.kind,
  budget: record.budget,
  budget_usdc: formatUsdc(record.budget),
  spent: record.spent,
  reserved: record.reserved,
  remaining: Math.max(0, record.budget - record.spent - record.reserved),
  requests: record.requests,
  created_at: record.createdAt,
  revoked_at: record.revokedAt,
  expires_at: record.expiresAt
})

const pathOf = (request: HttpServerRequest) => request.url.split("?")[0] ?? "/"

const decodeCreateKey = Schema.decodeUnknownEffect(Schema.fromJsonString(CreateKeyRequest))

const invalidBody = (error: Schema.SchemaError) =>
  new InvalidRequest({
    code: "invalid_request",
    message: `Invalid request payload: ${SchemaIssue.makeFormatterDefault()(error.issue)}`
  })

export const WalletsAdminHandlers = HttpApiBuilder.group(
  Api,
  "walletsAdmin",
  Effect.fn(function* (handlers) {
    const keys = yield* Keys
    return handlers.handle("setWallet", ({ payload }) => keys.setInvited(payload.wallet, payload.invited))
  })
)

export const KeysHandlers = HttpApiBuilder.group(
  Api,
  "keys",
  Effect.fn(function* (handlers) {
    const keys = yield* Keys
    const auth = yield* KeysAuth

    /** The signing wallet and the exact body it signed. */
    const signed = (request: HttpServerRequest) =>
      Effect.gen(function* () {
        // Oversize and unreadable bodies surface as defects the router middleware renders (413 / 400).
        const body = yield* Effect.orDie(request.text)
        const wallet = yield* auth.verify({
          method: request.method,
          path: pathOf(request),
          timestamp: request.headers["x-keys-timestamp"] ?? "",
          body,
          wallet: request.headers["x-keys-wallet"],
          signature: request.headers["x-keys-sig"]
        })
        return { wallet, body }
      })

    return handlers
      .handleRaw("createKey", ({ request }) =>
        Effect.gen(function* () {
          const { wallet, body } = yield* signed(request)
          const input = yield* decodeCreateKey(body).pipe(Effect.mapError(invalidBody))
          const budget = parseUsdc(input.budget_usdc)
          if (budget === undefined) {
            return yield* new InvalidRequest({
              code: "invalid_budget",
              param: "budget_usdc",
              message: 'budget_usdc must be a decimal string with at most 6 decimal places, e.g. "5.00"'
            })
          }
          const { record, secret } = yield* keys.create(wallet, {
            label: input.label,
            budget,
            spend: input.spend === true
          })
          return {
            id: record.keyId,
            object: "api_key" as const,
            key: secret,
            kind: record.kind,
            label: record.label,
            budget: record.budget,
            budget_usdc: formatUsdc(record.budget),
            created_at: record.createdAt
          }
        })
      )
      .handleRaw("listKeys", ({ request }) =>
        Effect.gen(function* () {
          const { wallet } = yield* signed(request)
          const records = yield* keys.list(wallet)
          return { object: "list" as const, wallet, data: records.map(keyView) }
        })
      )
      .handleRaw("revokeKey", ({ request, params }) =>
        Effect.gen(function* () {
          const { wallet } = yield* signed(request)
          return keyView(yield* keys.revoke(wallet, params.id))
        })
      )
      .handle("keysUsage", ({ request }) =>
        Effect.gen(function* () {
          const secret = request.headers["x-api-key"] ?? request.headers["x-credit-key"]
          if (secret === undefined) {
            return yield* new Unauthorized({
              code: "invalid_api_key",
              message: "Send a key in x-api-key or x-credit-key"
            })
          }
          const caller = yield* keys.resolveApiKey(secret)
          const records = yield* keys.list(caller.wallet)
          return {
            object: "list" as const,
            wallet: caller.wallet,
            key_id: caller.keyId,
            unit: BASE_UNIT,
            data: records.map(keyView)
          }
        })
      )
  })
)

export const CreditsHandlers = HttpApiBuilder.group(
  Api,
  "credits",
  Effect.fn(function* (handlers) {
    const credits = yield* Credits
    return handlers
      .handle("deposit", ({ payload, request }) =>
        Effect.gen(function* () {
          const amount = parseUsdc(payload.amount_usdc)
          if (amount === undefined || amount === 0) {
            return yield* new InvalidRequest({
              code: "invalid_amount",
              param: "amount_usdc",
              message: "amount_usdc must be a positive decimal string with at most 6 decimal places"
            })
          }
          const deposit = yield* credits.deposit({
            amount,
            paymentHeader: request.headers["payment-signature"] ?? request.headers["x-payment"]
          })
          return { ...deposit, object: "credit_deposit" as const }
        })
      )
      .handle("balance", ({ request }) => credits.keyBalance(request.headers["x-credit-key"]))
      .handle("withdraw", ({ payload }) => credits.withdraw(payload))
      .handle("withdrawal", ({ params }) => credits.withdrawal(params.id))
  })
)
