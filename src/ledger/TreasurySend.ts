import { Effect, Result, type Semaphore } from "effect"
import type { Hash } from "viem"
import type { ChainError, ChainShape, OutgoingCall } from "../chain/Chain.ts"
import { attributes, type OutgoingTransfer, purposeOf } from "./Transfers.ts"
import type { TreasuryLooks } from "./TreasuryLooks.ts"
import { groupBy, type Planned, type Recorded, type TreasuryRecords } from "./TreasuryRecords.ts"

/**
 * The treasury's sends (`Treasury.ts`): each transfer's call, the purposes already recorded adopted, the
 * rest estimated, then signed and recorded per sender in one transaction (`TreasuryRecords.recordAll`),
 * then offered (`TreasuryLooks.offerInOrder`), a nonce found taken re-signed alone (D490).
 */

/** What `sendMany` says of each transfer: its transaction's hash, or why nothing is recorded for it. */
export type Sent = Result.Result<Hash, ChainError>

const sameCall = (a: OutgoingCall, b: OutgoingCall) =>
  a.from.toLowerCase() === b.from.toLowerCase() &&
  a.to.toLowerCase() === b.to.toLowerCase() &&
  a.data.toLowerCase() === b.data.toLowerCase()

export interface TreasurySendOptions {
  readonly chain: ChainShape
  readonly records: TreasuryRecords
  readonly looks: TreasuryLooks
  /** Gas estimates and broadcasts in flight at once, shared with the looks (`CHAIN_CALLS_AT_ONCE`). */
  readonly chainCalls: Semaphore.Semaphore
}

export const makeTreasurySend = ({ chain, records, looks, chainCalls }: TreasurySendOptions) => {
  const { liveForAll, requireSameCall, recordAll, noteOffers } = records
  const { offerInOrder, broadcast, voidedNow } = looks

  const callOf = (transfer: OutgoingTransfer): Effect.Effect<OutgoingCall, ChainError> => {
    switch (transfer._tag) {
      case "X402Settlement":
        return Effect.succeed(chain.calls.transferWithAuthorization(transfer.authorization))
      case "UptoSettlement":
        return Effect.succeed(chain.calls.uptoSettlement(transfer.permit, transfer.amount))
      case "RefundBatch":
      case "ProviderPayout":
      case "Withdrawal":
        return Effect.succeed(chain.calls.treasuryTransfer(transfer.to, transfer.amount))
      case "EpochAnchor":
        return chain.calls.anchor(transfer.epochId, transfer.root)
    }
  }

  const sendAll = (transfers: ReadonlyArray<OutgoingTransfer>) =>
    Effect.gen(function* () {
      const results = new Map<string, Sent>()
      // One transfer per purpose: the same purpose twice in a batch is one transfer, and the same call.
      const wanted = new Map<string, { readonly transfer: OutgoingTransfer; readonly call: OutgoingCall }>()
      for (const transfer of transfers) {
        const purpose = purposeOf(transfer)
        const call = yield* Effect.result(callOf(transfer))
        const first = wanted.get(purpose)
        if (first !== undefined && Result.isSuccess(call) && !sameCall(first.call, call.success))
          return yield* Effect.die(new Error(`purpose ${purpose} is sent with two transfers`))
        if (first !== undefined || results.has(purpose)) continue
        if (Result.isFailure(call)) results.set(purpose, Result.fail(call.failure))
        else wanted.set(purpose, { transfer, call: call.success })
      }
      const adopted: Array<Recorded> = []
      for (const [purpose, record] of yield* liveForAll([...wanted.keys()])) {
        yield* requireSameCall(record, wanted.get(purpose)!.call)
        results.set(purpose, Result.succeed(record.tx_hash as Hash))
        adopted.push(record)
        wanted.delete(purpose)
      }
      // Estimated before any lock is taken: a call that would revert at the latest block is refused with
      // nothing signed (one the pool makes revert, as a nonce pooled by someone else, is mined reverted: D532).
      const plans = yield* Effect.forEach(
        wanted,
        ([purpose, { transfer, call }]) =>
          Effect.map(Effect.result(chainCalls.withPermit(chain.outgoing.plan(call))), (plan) => ({
            purpose,
            kind: transfer._tag,
            call,
            plan
          })),
        { concurrency: "unbounded" }
      )
      const planned: Array<Planned> = []
      for (const { purpose, kind, call, plan } of plans) {
        if (Result.isFailure(plan)) results.set(purpose, Result.fail(plan.failure))
        else planned.push({ purpose, kind, call, plan: plan.success })
      }
      const made: Array<Recorded> = []
      for (const [sender, group] of groupBy(planned, (p) => p.call.from.toLowerCase())) {
        const recorded = yield* Effect.result(recordAll(sender, group))
        if (Result.isFailure(recorded)) {
          for (const p of group) results.set(p.purpose, Result.fail(recorded.failure))
          continue
        }
        const { raced, refused } = recorded.success
        for (const p of group) {
          const theirs = raced.get(p.purpose)
          if (theirs === undefined) continue
          yield* requireSameCall(theirs, p.call)
          results.set(p.purpose, Result.succeed(theirs.tx_hash as Hash))
          adopted.push(theirs)
        }
        for (const [purpose, error] of refused) results.set(purpose, Result.fail(error))
        for (const record of recorded.success.recorded) {
          results.set(record.purpose, Result.succeed(record.tx_hash as Hash))
          made.push(record)
        }
      }
      // Recorded, so offered: every new one, and every adopted one not yet mined, each sender's in nonce order.
      const offered = [...made, ...adopted.filter((record) => record.status !== "mined")]
      const answers = yield* offerInOrder(offered)
      yield* noteOffers(offered.map((record, i) => [record, answers[i]!] as const))
      for (const [i, record] of made.entries()) {
        if (answers[i] !== "nonceUsed" || !(yield* voidedNow(record))) continue
        // Its nonce was taken by a transaction not ours (D331): the record is void and can never be
        // mined, so this purpose alone is signed once more, with a nonce the node has just been asked for.
        const again = planned.find((p) => p.purpose === record.purpose)!
        const resigned = yield* Effect.result(recordAll(record.sender, [again]))
        if (Result.isFailure(resigned)) {
          results.set(record.purpose, Result.fail(resigned.failure))
          continue
        }
        const replacement = resigned.success.recorded[0] ?? resigned.success.raced.get(record.purpose)
        const refusal = resigned.success.refused.get(record.purpose)
        if (replacement === undefined) {
          if (refusal !== undefined) results.set(record.purpose, Result.fail(refusal))
          continue
        }
        yield* requireSameCall(replacement, again.call)
        yield* broadcast(replacement)
        results.set(record.purpose, Result.succeed(replacement.tx_hash as Hash))
      }
      yield* Effect.annotateCurrentSpan({
        transfers: transfers.length,
        adopted: adopted.length,
        recorded: made.length
      })
      return transfers.map((transfer) => results.get(purposeOf(transfer))!)
    })

  const sendMany = (transfers: ReadonlyArray<OutgoingTransfer>) =>
    transfers.length === 0
      ? Effect.succeed([])
      : sendAll(transfers).pipe(Effect.withSpan("Treasury.sendMany"))

  const send = (transfer: OutgoingTransfer) =>
    sendAll([transfer]).pipe(
      Effect.flatMap(([sent]) => Effect.fromResult(sent!)),
      Effect.tap((hash) => Effect.annotateCurrentSpan({ tx_hash: hash })),
      Effect.withSpan("Treasury.send", { attributes: attributes(transfer) })
    )

  return { send, sendMany }
}
