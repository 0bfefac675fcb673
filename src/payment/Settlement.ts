import { Clock, Context, Effect, Layer } from "effect"
import { getAddress, type Hex } from "viem"
import { repeatInBackground } from "../Background.ts"
import { Chain } from "../chain/Chain.ts"
import { Authorizations, type ClaimedAuthorization } from "../ledger/Authorizations.ts"
import { Ledger, permit2NonceOf } from "../ledger/Ledger.ts"
import { type OutgoingTransfer, Treasury } from "../ledger/Treasury.ts"

/**
 * Submits captured x402 authorizations on chain, off every response's path: an `exact` one as the
 * signed EIP-3009 transfer, an `upto` one as a settlement of exactly its charge through the upto proxy
 * (Permit2 spends its nonce, so it can never transfer twice). A row is
 * claimed with `FOR UPDATE SKIP LOCKED`, so any number of router instances share the
 * queue without double submission; a failure is recorded and retried until the
 * authorization's `validBefore` passes. Nothing here is ever dropped.
 */
export class Settlement extends Context.Service<
  Settlement,
  {
    /** One pass over the queue; returns how many authorizations it handled. */
    readonly runOnce: Effect.Effect<number>
  }
>()("router/payment/Settlement") {
  static readonly make = Effect.gen(function* () {
    const chain = yield* Chain
    const ledger = yield* Ledger
    const treasury = yield* Treasury
    const authorizations = yield* Authorizations

    const landed = (row: ClaimedAuthorization, hash: Hex) =>
      Effect.gen(function* () {
        if (yield* authorizations.recordLanded(row, hash))
          yield* ledger.finalizeReceipt(row.request_id, { payment_ref: hash, settlement: "landed" })
      })

    const failed = (row: ClaimedAuthorization, reason: string) =>
      Effect.gen(function* () {
        const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const expired = BigInt(row.valid_before) <= BigInt(nowS)
        yield* authorizations.recordFailed(row, reason, expired)
        yield* Effect.logWarning("settlement attempt failed", { request_id: row.request_id, reason, expired })
        if (expired) yield* ledger.finalizeReceipt(row.request_id, { settlement: "failed" })
      })

    /**
     * Whether an earlier attempt already moved the money: the token's own record of the nonce (Permit2's
     * nonce bitmap for `upto`) is the truth, whatever happened to our wait for a receipt.
     */
    const alreadyUsed = (row: ClaimedAuthorization) =>
      row.scheme === "upto"
        ? chain.permit2NonceUsed(getAddress(row.payer), permit2NonceOf(row.nonce))
        : chain.authorizationState(getAddress(row.payer), row.nonce as Hex)

    /** What goes to the treasury: an EIP-3009 transfer of the signed value, or the charge of an `upto` permit. */
    const transferOf = (row: ClaimedAuthorization, signature: Hex): OutgoingTransfer =>
      row.scheme === "upto"
        ? {
            _tag: "UptoSettlement",
            requestId: row.request_id,
            amount: BigInt(row.value),
            permit: {
              from: getAddress(row.payer),
              permitted: { token: chain.token, amount: BigInt(row.ceiling ?? row.value) },
              spender: chain.uptoProxy,
              nonce: permit2NonceOf(row.nonce),
              deadline: BigInt(row.valid_before),
              witness: {
                to: chain.treasury,
                facilitator: chain.routerSigner,
                validAfter: BigInt(row.valid_after)
              },
              signature
            }
          }
        : {
            _tag: "X402Settlement",
            requestId: row.request_id,
            authorization: {
              from: getAddress(row.payer),
              to: chain.treasury,
              value: BigInt(row.value),
              validAfter: BigInt(row.valid_after),
              validBefore: BigInt(row.valid_before),
              nonce: row.nonce as Hex,
              signature
            }
          }

    const settleOne = (row: ClaimedAuthorization) =>
      Effect.gen(function* () {
        if (row.attempts > 1 && (yield* alreadyUsed(row))) {
          return yield* landed(row, (row.tx_hash ?? "unknown") as Hex)
        }
        if (row.signature === null) return yield* failed(row, "no signature on record")
        const hash = yield* treasury.send(transferOf(row, row.signature as Hex))
        yield* authorizations.recordBroadcast(row, hash)
        const outcome = yield* treasury.confirm(hash)
        if (outcome.status === "success") return yield* landed(row, hash)
        // A revert after an earlier attempt may mean that attempt landed: the token says which.
        if (yield* alreadyUsed(row)) return yield* landed(row, (row.tx_hash ?? hash) as Hex)
        return yield* failed(row, "transfer reverted")
      }).pipe(
        Effect.catchTag("ChainError", (e) =>
          // A failed send or wait can hide a transfer that did land (a resend then fails at gas
          // estimation): ask the token before recording a failure.
          alreadyUsed(row).pipe(
            Effect.orElseSucceed(() => false),
            Effect.flatMap((used) =>
              used ? landed(row, (row.tx_hash ?? "unknown") as Hex) : failed(row, `${e.reason}: ${e.message}`)
            )
          )
        ),
        Effect.withSpan("Settlement.settle", { attributes: { request_id: row.request_id } })
      )

    const runOnce = Effect.gen(function* () {
      yield* authorizations.recover
      const rows = yield* authorizations.claimDue
      yield* Effect.forEach(rows, settleOne, { concurrency: 4, discard: true })
      return rows.length
    }).pipe(Effect.withSpan("Settlement.runOnce"))

    return Settlement.of({ runOnce })
  })

  /** The service plus its background loop. */
  static readonly layer = Layer.effect(
    Settlement,
    Effect.gen(function* () {
      const settlement = yield* Settlement.make
      yield* repeatInBackground(settlement.runOnce, {
        every: "250 millis",
        failure: "settlement pass failed"
      })
      return settlement
    })
  )
}
