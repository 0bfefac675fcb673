import { Schema } from "effect"
import { Hex32, SignatureHex, WalletAddress } from "./Wire.ts"

/** EIP-712 typed data of a credit withdrawal intent (docs/protocol.md section 4). */
export const withdrawalTypes = {
  CreditWithdrawal: [
    { name: "wallet", type: "address" },
    { name: "to", type: "address" },
    { name: "amount", type: "uint256" },
    { name: "nonce", type: "bytes32" },
    { name: "deadline", type: "uint256" }
  ]
} as const

export const withdrawalDomain = (chainId: number) => ({ name: "svc Credits", version: "1", chainId }) as const

/** `POST /v1/credits/withdrawals`: the intent and the owner's signature over it. */
export const WithdrawalRequest = Schema.Struct({
  wallet: WalletAddress,
  to: WalletAddress,
  amount: Schema.String.check(
    Schema.isPattern(/^[1-9]\d{0,14}$/, { message: "expected a positive integer of base units" })
  ),
  nonce: Hex32,
  deadline: Schema.Int.check(Schema.isGreaterThan(0)),
  signature: SignatureHex
})
export type WithdrawalRequest = typeof WithdrawalRequest.Type

/** A withdrawal as its owner reads it; times in unix seconds. */
export const WithdrawalView = Schema.Struct({
  withdrawal_id: Schema.String,
  wallet: Schema.String,
  to: Schema.String,
  amount: Schema.Number,
  status: Schema.Literals(["pending", "paid", "failed"]),
  tx_hash: Schema.NullOr(Schema.String),
  created_at: Schema.Number,
  paid_at: Schema.NullOr(Schema.Number)
})
export type WithdrawalView = typeof WithdrawalView.Type

/** `GET /v1/credits/balance`: the owner's balance and the spending key's own budget. */
export const CreditBalance = Schema.Struct({
  object: Schema.Literal("credit_balance"),
  wallet: Schema.String,
  unit: Schema.String,
  available: Schema.Number,
  reserved: Schema.Number,
  pending: Schema.Number,
  available_usdc: Schema.String,
  reserved_usdc: Schema.String,
  pending_usdc: Schema.String,
  key: Schema.Struct({
    id: Schema.String,
    label: Schema.String,
    budget: Schema.Number,
    spent: Schema.Number,
    reserved: Schema.Number,
    remaining: Schema.Number
  })
})
export type CreditBalance = typeof CreditBalance.Type
