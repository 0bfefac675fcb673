import { Context, Effect, Layer, Result } from "effect"
import { getAddress } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Treasury } from "./Treasury.ts"
import { type ClaimedWithdrawal, Wallets } from "./Wallets.ts"

/** After this many attempts with no transfer outstanding, the withdrawal fails and is credited back. */
const MAX_PAYOUT_ATTEMPTS = 12

/**
 * Pays out debited withdrawals on chain, off every response's path (and fails the deposits whose
 * authorization can no longer settle), each exactly once through `Treasury`.
 */
export class Withdrawals extends Context.Service<
  Withdrawals,
  {
    /** One pass of the payout queue (and of deposits whose funding failed); returns rows handled. */
    readonly runOnce: Effect.Effect<number>
  }
>()("router/ledger/Withdrawals") {
  static readonly make = Effect.gen(function* () {
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
     * Sending is idempotent per withdrawal (ledger/Treasury.ts): an attempt after a crash or a failed wait
     * gets the transaction already recorded for it, never a second transfer. Only a send that recorded
     * nothing, or a transfer that moved nothing (reverted, or replaced at its nonce), counts as a failed
     * attempt; a wait that fails keeps the hash for the next attempt.
     */
    const payOne = (row: ClaimedWithdrawal) =>
      Effect.gen(function* () {
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
        if (row.tx_hash !== hash) yield* wallets.recordWithdrawalBroadcast(row.withdrawal_id, hash)
        const outcome = yield* Effect.result(treasury.confirm(hash))
        if (Result.isFailure(outcome)) return yield* retryLater(row, outcome.failure.message, false)
        if (outcome.success.status === "success")
          return yield* wallets.withdrawalPaid(row.withdrawal_id, hash)
        return yield* retryLater(row, `payout transfer ${outcome.success.status}`, true)
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
