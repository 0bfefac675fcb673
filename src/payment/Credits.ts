import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { getAddress, type Hex, verifyTypedData } from "viem"
import { Chain } from "../chain/Chain.ts"
import {
  type CreditBalance,
  type WithdrawalRequest,
  type WithdrawalView,
  withdrawalDomain,
  withdrawalTypes
} from "../domain/Credits.ts"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import type { PaymentRequired } from "../domain/X402.ts"
import { PayoutConfig } from "../ledger/Epochs.ts"
import { type Balance, Wallets } from "../ledger/Wallets.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { BASE_UNIT, formatUsdc, Keys } from "./Keys.ts"
import { PaymentVerifier } from "./PaymentVerifier.ts"
import { paymentRequired } from "./X402.ts"

export { type Balance, type WithdrawalRequest, type WithdrawalView, withdrawalDomain, withdrawalTypes }

export interface Deposit {
  readonly deposit_id: string
  readonly status: "pending"
  readonly amount: number
  readonly amount_usdc: string
  readonly wallet: string
}

/**
 * Prepaid credits: deposits by an exact x402 payment (credited when the transfer lands), balances, and
 * withdrawals by a wallet-signed EIP-712 intent (paid out on chain by `ledger/Withdrawals`). The money
 * itself moves in `ledger/Wallets`.
 */
export class Credits extends Context.Service<
  Credits,
  {
    /** No header: the 402 quoting exactly `amount`. Otherwise verify, gate on invite, reserve, capture. */
    readonly deposit: (input: {
      readonly amount: number
      readonly paymentHeader: string | undefined
    }) => Effect.Effect<Deposit, PaymentRequired | Forbidden | InvalidRequest>
    readonly balance: (wallet: string) => Effect.Effect<Balance>
    /** The balance a spend-capable key (`x-credit-key`) draws on, with the key's own budget. */
    readonly keyBalance: (
      creditKey: string | undefined
    ) => Effect.Effect<CreditBalance, Unauthorized | Forbidden>
    readonly withdraw: (
      request: WithdrawalRequest
    ) => Effect.Effect<WithdrawalView, InvalidRequest | Unauthorized | Conflict>
    readonly withdrawal: (id: string) => Effect.Effect<WithdrawalView, NotFound>
  }
>()("router/payment/Credits") {
  static readonly layer = Layer.effect(
    Credits,
    Effect.gen(function* () {
      const chain = yield* Chain
      const wallets = yield* Wallets
      const verifier = yield* PaymentVerifier
      const keys = yield* Keys
      const config = yield* RouterConfig
      const { payoutFloor } = yield* PayoutConfig
      const resourceUrl = `${config.publicUrl}/v1/credits/deposits`

      const deposit = Effect.fn("Credits.deposit")(function* (input: {
        readonly amount: number
        readonly paymentHeader: string | undefined
      }) {
        const { amount } = input
        const floor = verifier.settings.soloSettleFloor
        if (amount < floor) {
          return yield* new InvalidRequest({
            code: "deposit_below_minimum",
            param: "amount_usdc",
            message: `A deposit is at least the solo settlement floor, ${formatUsdc(floor)} USDC`
          })
        }
        const description = `Prepaid credit deposit of ${formatUsdc(amount)} USDC`
        if (input.paymentHeader === undefined) {
          return yield* verifier.quote({ worstCase: amount, resourceUrl, description })
        }
        const verified = yield* verifier.verifyExact({
          header: input.paymentHeader,
          worstCase: amount,
          resourceUrl,
          description
        })
        const reject = (error: string) =>
          paymentRequired({
            settings: verifier.settings,
            worstCase: amount,
            resourceUrl,
            description,
            code: "payment_invalid",
            error
          })
        if (verified.value !== BigInt(amount)) {
          return yield* reject("a deposit authorization signs exactly the amount deposited")
        }
        const payer = verified.payer.toLowerCase()
        if (!(yield* keys.isInvited(payer))) {
          return yield* new Forbidden({
            code: "wallet_not_invited",
            message: "Prepaid-credit deposits are open to invited wallets only; nothing was charged"
          })
        }
        const depositId = `dep_${randomBytes(12).toString("hex")}`
        const { nonce, validAfter, validBefore } = verified.authorization
        yield* wallets
          .recordDeposit({
            depositId,
            payer,
            amount,
            hold: { nonce, validAfter, validBefore, signature: verified.signature, balance: verified.balance }
          })
          .pipe(Effect.catchTag("NonceReplay", () => Effect.fail(reject("authorization already used"))))
        return {
          deposit_id: depositId,
          status: "pending",
          amount,
          amount_usdc: formatUsdc(amount),
          wallet: payer
        } satisfies Deposit
      })

      const withdrawal = Effect.fn("Credits.withdrawal")(function* (id: string) {
        const view = yield* wallets.withdrawalById(id)
        if (view === undefined) {
          return yield* new NotFound({ code: "withdrawal_not_found", message: `No withdrawal ${id}` })
        }
        return view
      })

      const withdraw = Effect.fn("Credits.withdraw")(function* (request: WithdrawalRequest) {
        const wallet = request.wallet.toLowerCase()
        const nonce = request.nonce.toLowerCase()
        const amount = Number(request.amount)
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        if (request.deadline <= nowS) {
          return yield* new InvalidRequest({
            code: "withdrawal_expired",
            param: "deadline",
            message: "The withdrawal intent's deadline has passed; sign a new one"
          })
        }
        if (amount < payoutFloor) {
          return yield* new InvalidRequest({
            code: "below_payout_floor",
            param: "amount",
            message: `A withdrawal is at least the payout floor of ${payoutFloor} base units`
          })
        }
        const signed = yield* Effect.tryPromise(() =>
          verifyTypedData({
            address: getAddress(wallet),
            domain: withdrawalDomain(chain.chainId),
            types: withdrawalTypes,
            primaryType: "CreditWithdrawal",
            message: {
              wallet: getAddress(wallet),
              to: getAddress(request.to.toLowerCase()),
              amount: BigInt(request.amount),
              nonce: nonce as Hex,
              deadline: BigInt(request.deadline)
            },
            signature: request.signature as Hex
          })
        ).pipe(Effect.orElseSucceed(() => false))
        if (!signed) {
          return yield* new Unauthorized({
            code: "invalid_withdrawal_signature",
            message: "signature is not a CreditWithdrawal signed by wallet over these fields"
          })
        }
        const replayed = (id: string) =>
          new Conflict({
            code: "idempotency_replay",
            param: "nonce",
            message: `This nonce already made withdrawal ${id}; read it at /v1/credits/withdrawals/${id}`
          })
        const earlier = yield* wallets.withdrawalByNonce(nonce)
        if (earlier !== undefined) return yield* replayed(earlier.withdrawal_id)

        const id = `wd_${randomBytes(12).toString("hex")}`
        const debited = yield* wallets.debitWithdrawal({
          withdrawalId: id,
          wallet,
          to: request.to.toLowerCase(),
          amount,
          nonce
        })
        if (debited === "nonce_used") {
          const row = yield* wallets.withdrawalByNonce(nonce)
          return yield* replayed(row?.withdrawal_id ?? "unknown")
        }
        if (debited === "insufficient") {
          const { available } = yield* wallets.balance(wallet)
          return yield* new InvalidRequest({
            code: "insufficient_balance",
            param: "amount",
            message: `The available balance is ${available} base units, below the ${amount} asked; nothing was debited`
          })
        }
        return yield* Effect.orDie(withdrawal(id))
      })

      const keyBalance = Effect.fn("Credits.keyBalance")(function* (creditKey: string | undefined) {
        if (creditKey === undefined) {
          return yield* new Unauthorized({
            code: "invalid_credit_key",
            message: "Send a spend-capable key in x-credit-key"
          })
        }
        const key = yield* keys.resolveCreditKey(creditKey)
        const balance = yield* wallets.balance(key.wallet)
        return {
          object: "credit_balance",
          wallet: key.wallet,
          unit: BASE_UNIT,
          ...balance,
          available_usdc: formatUsdc(balance.available),
          reserved_usdc: formatUsdc(balance.reserved),
          pending_usdc: formatUsdc(balance.pending),
          key: {
            id: key.keyId,
            label: key.label,
            budget: key.budget,
            spent: key.spent,
            reserved: key.reserved,
            remaining: Math.max(0, key.budget - key.spent - key.reserved)
          }
        } satisfies CreditBalance
      })

      return Credits.of({ deposit, balance: wallets.balance, keyBalance, withdraw, withdrawal })
    })
  )
}
