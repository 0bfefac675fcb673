import { Cause, Effect, Exit, Metric, Option } from "effect"
import type { NonEmptyReadonlyArray } from "effect/Array"
import type { ServiceUnavailable } from "../domain/Errors.ts"
import { makeTurnBatches } from "../process/TurnBatches.ts"
import type { CreditRefused, CreditReserved, KeyRefused, ReservationRecord } from "./Reserve.ts"

type KeyRecord = Omit<ReservationRecord, "payer">
type Refusal = KeyRefused | CreditRefused | ServiceUnavailable

/** How many reservations each statement on a key as sent made (the count: the statements; the sum: the calls). */
export const reserveBatchSize = Metric.histogram("svc_reserve_batch_size", {
  description: "Key reservations per reserving statement",
  boundaries: [1, 2, 4, 8, 16, 32, 64]
})

/** Calls reserved alone after their batch's statement failed (a key's cap or balance, or a fault). */
export const reserveBatchAlone = Metric.counter("svc_reserve_batch_alone_total", {
  description: "Key reservations made alone after the batched statement they were in failed",
  incremental: true
})

/**
 * The reservations on one key as sent that become ready in the same turn of the event loop go to Postgres as
 * one statement (D545): the key's and its owner's balance rows are updated once for all of them, and one round
 * trip answers every call, each as if reserved alone in its order. A lone call goes at once, as before.
 *
 * All of a batch fit or none is written. A batch the key's cap or the owner's balance cannot cover whole, or
 * that fails for any other reason, is written again one record at a time, each answered as alone (the
 * reservations near a key's end are refused exactly as they were, one by one). A key that fails a gate (unknown,
 * revoked, read-only, its owner not invited) fails it for every call of the batch, as each would alone. The
 * batch is checked against the latest clock reading among its calls, so an expiring key is never let past it;
 * a call whose own reading is earlier than that, refused as expired, is reserved alone at its own reading.
 */
export const makeKeyReserveBatch = (reservations: {
  /** The statement over one key's records of a turn. */
  readonly reserveCreditKeys: (
    records: NonEmptyReadonlyArray<KeyRecord>,
    keyHash: string,
    nowMs: number
  ) => Effect.Effect<ReadonlyArray<CreditReserved>, Refusal>
  /** The same statement over one record, alone. */
  readonly reserveCreditKey: (
    record: KeyRecord,
    keyHash: string,
    nowMs: number
  ) => Effect.Effect<CreditReserved, Refusal>
}) =>
  Effect.gen(function* () {
    interface Call {
      readonly record: KeyRecord
      readonly nowMs: number
    }
    interface Answer {
      readonly exit: Exit.Exit<ReadonlyArray<CreditReserved>, Refusal>
      readonly size: number
      /** The clock reading the key was checked against: the latest of the batch's calls. */
      readonly latest: number
    }
    const alone = reservations.reserveCreditKey

    const batches = yield* makeTurnBatches(
      (keyHash: string, calls: ReadonlyArray<Call>): Effect.Effect<Answer> => {
        const latest = calls.reduce((latest, call) => Math.max(latest, call.nowMs), 0)
        return Metric.update(reserveBatchSize, calls.length).pipe(
          Effect.andThen(
            Effect.suspend(() => {
              const [first, ...rest] = calls.map((call) => call.record)
              return reservations.reserveCreditKeys([first!, ...rest], keyHash, latest)
            })
          ),
          Effect.exit,
          Effect.map((exit) => ({ exit, size: calls.length, latest }))
        )
      }
    )

    /** Reserves `record` on the key whose secret hashes to `keyHash`, in the key's batch of this turn. */
    const reserve = (
      record: KeyRecord,
      keyHash: string,
      nowMs: number
    ): Effect.Effect<CreditReserved, Refusal> =>
      Effect.flatMap(batches.add(keyHash, { record, nowMs }), (batched) => {
        if (batched === undefined) return alone(record, keyHash, nowMs)
        const { answer, index } = batched
        if (Exit.isSuccess(answer.exit)) return Effect.succeed(answer.exit.value[index]!)
        // Alone, or the key itself refused: the answer is this call's own. An expiry read at a later call's
        // clock than this one's is not: this call goes alone, at its own.
        const refused = Cause.findErrorOption(answer.exit.cause)
        const keyRefused =
          Option.isSome(refused) &&
          refused.value._tag === "KeyRefused" &&
          !(refused.value.reason === "expired" && nowMs < answer.latest)
        if (answer.size === 1 || keyRefused) return Effect.failCause(answer.exit.cause)
        return Effect.andThen(Metric.update(reserveBatchAlone, 1), alone(record, keyHash, nowMs))
      })

    return { reserve }
  })
