import { Clock, Duration, Effect, Option, Result } from "effect"
import type { Hash } from "viem"
import { ChainError, type ChainShape } from "../chain/Chain.ts"
import type { TransferOutcome } from "./Transfers.ts"
import type { TreasuryLooks } from "./TreasuryLooks.ts"
import { outcomeOf, type Recorded, type TreasuryRecords } from "./TreasuryRecords.ts"

/**
 * The treasury's confirms and recovery (`Treasury.ts`): a batch's records read once, then one look a block
 * (`TreasuryLooks.resolveAll`) until each is final, fails or times out, each look's finished ones handed
 * over at once (D491, D516); the recovery pass resolves every open record.
 */

/** What `confirmMany` says of each hash: how its transfer ended, or why that is not known yet. */
export type Confirmed = Result.Result<TransferOutcome, ChainError>
/**
 * Told, as soon as a look of `confirmMany` has written them, the hashes it finished (final, or failed), each
 * with what `confirmMany` will say of it (D516): a caller acts on those without waiting for the slowest.
 */
export type OnConfirmed = (finished: ReadonlyArray<readonly [Hash, Confirmed]>) => Effect.Effect<void>

export interface TreasuryConfirmOptions {
  readonly chain: ChainShape
  readonly records: TreasuryRecords
  readonly looks: TreasuryLooks
  /** The chain's head, asked at most once a poll interval (the one the looks share, D452). */
  readonly head: Effect.Effect<bigint, ChainError>
  /** How long a confirm waits for a transfer to be final before failing `Timeout`. */
  readonly confirmTimeout: Duration.Duration
}

export const makeTreasuryConfirm = ({
  chain,
  records,
  looks,
  head,
  confirmTimeout
}: TreasuryConfirmOptions) => {
  const { byHashes, allOpen } = records
  const { blockAfter, resolveAll, resolve, fillGapsBelow } = looks

  const confirmAll = (hashes: ReadonlyArray<Hash>, onFinished?: OnConfirmed) =>
    Effect.gen(function* () {
      const wanted = [...new Set(hashes.map((hash) => hash.toLowerCase()))]
      // Each hash as the caller spelled it (the first spelling), for the hand-over.
      const spelled = new Map<string, Hash>()
      for (const hash of hashes) if (!spelled.has(hash.toLowerCase())) spelled.set(hash.toLowerCase(), hash)
      const results = new Map<string, Confirmed>()
      /** Keeps what a step finished and hands it over at once (D516): nothing waits for the slowest. */
      const finish = (done: ReadonlyArray<readonly [string, Confirmed]>) =>
        Effect.gen(function* () {
          for (const [hash, confirmed] of done) results.set(hash, confirmed)
          if (onFinished !== undefined && done.length > 0)
            yield* onFinished(done.map(([hash, confirmed]) => [spelled.get(hash)!, confirmed] as const))
        })
      const records = yield* byHashes(wanted)
      const known = new Set(records.map((record) => record.tx_hash))
      // A hash the treasury did not sign (recorded before it existed): the chain's receipt alone.
      const theirs = Effect.forEach(
        wanted.filter((hash) => !known.has(hash)),
        (hash) =>
          Effect.flatMap(Effect.result(chain.waitForReceipt(hash as Hash)), (receipt) =>
            finish([[hash, receipt]])
          ),
        { concurrency: "unbounded", discard: true }
      )
      let open: Array<Recorded> = []
      const already: Array<readonly [string, Confirmed]> = []
      for (const record of records) {
        const final = outcomeOf(record)
        if (final === undefined) open.push(record)
        else already.push([record.tx_hash, Result.succeed(final)])
      }
      yield* finish(already)
      const ours = new Set(records.map((record) => record.id))
      const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(confirmTimeout)
      const looks = Effect.gen(function* () {
        while (open.length > 0) {
          // The head before the look: a block mined during the look is then a new one to look again at.
          const seen = Option.getOrUndefined(yield* Effect.option(head))
          const resolutions = yield* resolveAll(open)
          const done: Array<readonly [string, Confirmed]> = []
          const pending = open.filter((record, i) => {
            const resolution = resolutions[i]!
            if (Result.isSuccess(resolution) && resolution.success.status === "pending") return true
            done.push([record.tx_hash, resolution as Confirmed])
            return false
          })
          yield* finish(done.splice(0))
          const gaps =
            pending.length === 0 ? new Map<string, ChainError>() : yield* fillGapsBelow(pending, ours)
          open = pending.filter((record) => {
            const error = gaps.get(record.sender)
            if (error !== undefined) done.push([record.tx_hash, Result.fail(error)])
            return error === undefined
          })
          if (open.length > 0 && (yield* Clock.currentTimeMillis) >= deadline) {
            for (const record of open)
              done.push([
                record.tx_hash,
                Result.fail(
                  new ChainError({
                    reason: "Timeout",
                    message: `Treasury.confirm: ${record.tx_hash} not final in ${Duration.format(confirmTimeout)}`
                  })
                )
              ])
            open = []
          }
          yield* finish(done)
          if (open.length === 0) return
          yield* blockAfter(seen)
        }
      })
      yield* Effect.all([looks, theirs], { concurrency: "unbounded", discard: true })
      return hashes.map((hash) => results.get(hash.toLowerCase())!)
    })

  const confirmMany = (hashes: ReadonlyArray<Hash>, onFinished?: OnConfirmed) =>
    hashes.length === 0
      ? Effect.succeed([])
      : confirmAll(hashes, onFinished).pipe(
          Effect.withSpan("Treasury.confirmMany", { attributes: { hashes: hashes.length } })
        )

  const confirm = (hash: Hash) =>
    confirmAll([hash]).pipe(
      Effect.flatMap(([confirmed]) => Effect.fromResult(confirmed!)),
      Effect.withSpan("Treasury.confirm", { attributes: { tx_hash: hash } })
    )

  const recover = Effect.gen(function* () {
    const open = yield* allOpen
    let left = 0
    for (const record of open) {
      const resolution = yield* resolve(record).pipe(
        Effect.catchTag("ChainError", (e) =>
          Effect.as(
            Effect.logWarning("recovery could not resolve an outgoing transaction", {
              purpose: record.purpose,
              tx_hash: record.tx_hash,
              error: e.message
            }),
            { status: "pending" } as const
          )
        )
      )
      if (resolution.status === "pending") left++
    }
    yield* Effect.annotateCurrentSpan({ open: open.length, left })
    return left
  }).pipe(Effect.withSpan("Treasury.recover"))

  return { confirm, confirmMany, recover }
}
