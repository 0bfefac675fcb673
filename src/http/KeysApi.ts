import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { CreditBalance, WithdrawalRequest, WithdrawalView } from "../domain/Credits.ts"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import { WalletAddress as Address } from "../domain/Wire.ts"
import { KeyKind } from "../payment/Keys.ts"
import { OperatorAuth } from "./AdminAuth.ts"
import { openAi, PaymentRequiredWire } from "./ErrorWire.ts"

export class WalletsAdminApi extends HttpApiGroup.make("walletsAdmin")
  .add(
    HttpApiEndpoint.post("setWallet", "/v1/admin/wallets", {
      payload: Schema.Struct({ wallet: Address, invited: Schema.Boolean }),
      success: Schema.Struct({ wallet: Schema.String, invited: Schema.Boolean })
    })
  )
  .middleware(OperatorAuth) {}

/** `POST /v1/keys` (spec 2.11), plus `spend: true` to ask for a spend-capable credit key. */
export const CreateKeyRequest = Schema.Struct({
  label: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(100)),
  budget_usdc: Schema.String,
  spend: Schema.optionalKey(Schema.Boolean)
})

/** A key as its owner lists it: never the secret. Amounts in base units, times in unix seconds. */
export const KeyView = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("api_key"),
  label: Schema.String,
  kind: KeyKind,
  budget: Schema.Number,
  budget_usdc: Schema.String,
  spent: Schema.Number,
  reserved: Schema.Number,
  remaining: Schema.Number,
  requests: Schema.Number,
  created_at: Schema.Number,
  revoked_at: Schema.NullOr(Schema.Number),
  /** Past it the key neither spends nor reads; null: it never expires. */
  expires_at: Schema.NullOr(Schema.Number)
})

export const CreatedKey = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("api_key"),
  /** The secret, shown once: `svc_ck_…` for `x-credit-key`, `svc_ak_…` for `x-api-key`. */
  key: Schema.String,
  kind: KeyKind,
  label: Schema.String,
  budget: Schema.Number,
  budget_usdc: Schema.String,
  created_at: Schema.Number
}).pipe(HttpApiSchema.status(201))

const SignedErrors = [openAi(InvalidRequest), openAi(Unauthorized), openAi(Forbidden)] as const

/**
 * Wallet-signed key management (`x-keys-wallet`, `x-keys-timestamp`, `x-keys-sig`; docs/protocol.md
 * section 4). The handlers read the raw body: the signature covers its exact bytes.
 */
export class KeysApi extends HttpApiGroup.make("keys").add(
  HttpApiEndpoint.post("createKey", "/v1/keys", {
    payload: CreateKeyRequest,
    success: CreatedKey,
    error: SignedErrors
  }),
  HttpApiEndpoint.get("listKeys", "/v1/keys", {
    success: Schema.Struct({
      object: Schema.Literal("list"),
      wallet: Schema.String,
      data: Schema.Array(KeyView)
    }),
    error: SignedErrors
  }),
  HttpApiEndpoint.get("keysUsage", "/v1/keys/usage", {
    success: Schema.Struct({
      object: Schema.Literal("list"),
      wallet: Schema.String,
      key_id: Schema.String,
      unit: Schema.String,
      data: Schema.Array(KeyView)
    }),
    error: openAi(Unauthorized)
  }),
  HttpApiEndpoint.delete("revokeKey", "/v1/keys/:id", {
    params: { id: Schema.String },
    success: KeyView,
    error: [...SignedErrors, openAi(NotFound)]
  })
) {}

export const DepositRequest = Schema.Struct({ amount_usdc: Schema.String })

export const DepositAccepted = Schema.Struct({
  deposit_id: Schema.String,
  object: Schema.Literal("credit_deposit"),
  status: Schema.Literal("pending"),
  wallet: Schema.String,
  amount: Schema.Number,
  amount_usdc: Schema.String
}).pipe(HttpApiSchema.status(202))

export class CreditsApi extends HttpApiGroup.make("credits").add(
  HttpApiEndpoint.post("deposit", "/v1/credits/deposits", {
    payload: DepositRequest,
    success: DepositAccepted,
    error: [openAi(InvalidRequest), openAi(Forbidden), PaymentRequiredWire]
  }),
  HttpApiEndpoint.get("balance", "/v1/credits/balance", {
    success: CreditBalance,
    error: [openAi(Unauthorized), openAi(Forbidden)]
  }),
  HttpApiEndpoint.post("withdraw", "/v1/credits/withdrawals", {
    payload: WithdrawalRequest,
    success: WithdrawalView.pipe(HttpApiSchema.status(202)),
    error: [openAi(InvalidRequest), openAi(Unauthorized), openAi(Conflict)]
  }),
  HttpApiEndpoint.get("withdrawal", "/v1/credits/withdrawals/:id", {
    params: { id: Schema.String },
    success: WithdrawalView,
    error: openAi(NotFound)
  })
) {}
