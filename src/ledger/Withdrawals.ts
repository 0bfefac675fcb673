import { Context, Effect, Layer, Option, Result } from "effect"
import { getAddress, type Hash, TransactionNotFoundError, TransactionReceiptNotFoundError } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Chain } from "../chain/Chain.ts"
import { Treasury } from "./Treasury.ts"
import { type ClaimedWithdrawal, Wallets } from "./Wallets.ts"

/** After this many attempts with no transfer outstanding, the withdrawal fails and is credited back. */
const MAX_PAYOUT_ATTEMPTS = 12

/**
 * Pays out debited withdrawals on chain, off every response's path (and fails the deposits whose
 * authorization can no longer settle). A transfer's hash is recorded before it is awaited, so a retry
 * after a crash looks that transfer up instead of paying twice.
 */
export class Withdrawals extends Context.Service<
  Withdrawals,
  {
    /** One pass of the payout queue (and of deposits whose funding failed); returns rows handled. */
    readonly runOnce: Effect.Effect<number>
  }
>()("router/ledger/Withdrawals") {
  static readonly make = Effect.gen(function* () {
    const chain = yield* Chain
    const treasury = yield* Treasury
    const wallets = yield* Wallets

    const retryLater = (row: ClaimedWithdrawal, reason: string, clearTx: boolean) =>
      Effect.gen(function* () {
        const giveUp = clearTx && row.attempts >= MAX_PAYOUT_ATTEMPTS
        yield* wallets.withdrawalRetry(row, reason, clearTx, giveUp)
        if (giveUp) {
          return yield* Effect.logError("withdrawal failed; credited back", { id: row.withdrawal_id, reason })
        }
        yield* Effect.logWarning("withdrawal payout attempt failed", { id: row.withdrawal_id, reason })
      })

    /**
     * Where a transfer sent by an earlier attempt stands. Only a transaction the node has never heard of is
     * `unknown` (and is sent again); an unreadable node is `pending`, so a payout is never sent twice.
     */
    const transferState = (hash: Hash) =>
      Effect.gen(function* () {
        const receipt = yield* Effect.tryPromise({
          try: () => chain.publicClient.getTransactionReceipt({ hash }),
          catch: (error) => error
        }).pipe(Effect.option)
        if (Option.isSome(receipt)) return receipt.value.status
        const known = yield* Effect.tryPromise({
          try: () => chain.publicClient.getTransaction({ hash }),
          catch: (error) => error
        }).pipe(
          Effect.as(true),
          Effect.catch((error) =>
            Effect.succeed(
              !(error instanceof TransactionNotFoundError || error instanceof TransactionReceiptNotFoundError)
            )
          )
        )
        return known ? "pending" : "unknown"
      })

    const payOne = (row: ClaimedWithdrawal) =>
      Effect.gen(function* () {
        if (row.tx_hash !== null) {
          const state = yield* transferState(row.tx_hash as Hash)
          if (state === "success") return yield* wallets.withdrawalPaid(row.withdrawal_id, row.tx_hash)
          if (state === "pending") return yield* retryLater(row, "transfer still pending", false)
        }
        const sent = yield* Effect.result(
          treasury.send({
            _tag: "Withdrawal",
            withdrawalId: row.withdrawal_id,
            to: getAddress(row.to_address),
            amount: BigInt(row.amount)
          })
        )
        if (Result.isFailure(sent)) return yield* retryLater(row, sent.failure.message, true)
        const hash = sent.success
        // Recorded before it is awaited: a retry after a crash looks this transfer up instead of paying twice.
        yield* wallets.recordWithdrawalBroadcast(row.withdrawal_id, hash)
        const outcome = yield* Effect.result(treasury.confirm(hash))
        if (Result.isFailure(outcome)) return yield* retryLater(row, outcome.failure.message, false)
        if (outcome.success.status === "success")
          return yield* wallets.withdrawalPaid(row.withdrawal_id, hash)
        return yield* retryLater(row, "payout transfer reverted", true)
      }).pipe(Effect.withSpan("Credits.payout", { attributes: { withdrawal_id: row.withdrawal_id } }))

    const runOnce = Effect.gen(function* () {
      const failed = yield* wallets.failDeposits
      const rows = yield* wallets.claimWithdrawals
      yield* Effect.forEach(rows, payOne, { concurrency: 4, discard: true })
      return rows.length + failed.length
    }).pipe(Effect.withSpan("Credits.runOnce"))

    return Withdrawals.of({ runOnce })
  })

  /** The service plus its payout loop. */
  static readonly layer = Layer.effect(
    Withdrawals,
    Effect.gen(function* () {
      const withdrawals = yield* Withdrawals.make
      yield* repeatInBackground(withdrawals.runOnce, { every: "500 millis", failure: "credits pass failed" })
      return withdrawals
    })
  )
}
