import { Clock, Context, Duration, Effect, Layer, Metric, Schedule } from "effect"
import type { SqlError } from "effect/sql"
import type { TokenCounts } from "../domain/Billing.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import type { AuctionCleared, RankedBid } from "../market/Auction.ts"
import { retryAfterFailure } from "../process/Retry.ts"
import { within } from "../process/Within.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { traced } from "../Telemetry.ts"
import { epochOf } from "./Epochs.ts"
import { type CaptureRecord, Ledger, type PaymentSource, type StaleReservation } from "./Ledger.ts"
import { type MeterRecord, meterRecordOf } from "./Metered.ts"
import {
  type EconomicsDetail,
  economicsOf,
  type PaidBy,
  paymentRefOf,
  type ReceiptFacts,
  receiptOf
} from "./Records.ts"

/** Settlement writes that failed and were tried again (a database fault under a capture or release). */
export const settleRetries = Metric.counter("svc_settle_retries_total", {
  description: "Captures and releases that failed on a database fault and were tried again",
  incremental: true
})

/**
 * Settlements that could not be written on the reply's path: the caller got its answer, the final
 * meter was recorded on the request's row and the write is retried in the background (D211).
 */
export const settleDeferred = Metric.counter("svc_settle_deferred_total", {
  description: "Captures and releases handed to the background retry after a database fault",
  incremental: true
})

/**
 * Settlements the background retry gave up on: the request stays `reserved` with its final meter (its
 * durable record), which the reaper captures, never silently released.
 */
export const settleAbandoned = Metric.counter("svc_settle_abandoned_total", {
  description: "Captures and releases given up after every retry (the reaper settles them from their record)",
  incremental: true
})

/** Reservations settled from their durable record: a dead instance's, or one the reaper found. */
export const settledFromRecord = Metric.counter("svc_settled_from_record_total", {
  description:
    "Reservations settled from their recorded meter (dead instance or reaper): delivered charge captured",
  incremental: true
})

/** An x402 authorization settled from a record needs this long before its `validBefore` to land. */
const COLLECT_RUNWAY_S = 60

/** Tries on the reply's path (then the background takes over), and the bound on all of them. */
const INLINE_RETRY = Schedule.exponential("50 millis")
const INLINE_RETRIES = 2
const INLINE_BOUND_MS = 2_000

/** The background retry: exponential from 250 ms, at most 15 s apart, 20 times (about 4 minutes). */
const BACKGROUND_RETRY = Schedule.exponential("250 millis").pipe(
  Schedule.modifyDelay(({ duration }) => Effect.succeed(Duration.min(duration, Duration.seconds(15))))
)
const BACKGROUND_RETRIES = 20

/** How a paid request ended: what was served, by whom, metered how, and what is charged. */
export interface Served {
  readonly requestId: string
  /** Unix milliseconds. */
  readonly createdAt: number
  readonly payer: string
  readonly auction: AuctionCleared
  /** The bid that served (the winner, or the fallback that replaced it). */
  readonly servedBy: RankedBid
  /** Metered tokens (images: one prompt, and one image when delivered). */
  readonly tokens: TokenCounts
  readonly charged: number
  readonly authorized: number
  /** `released`: nothing was delivered, nothing is charged, the whole reservation goes back. */
  readonly status: ReceiptBody["status"]
  readonly ttftMs: number
  readonly paidBy: PaidBy
  readonly source: PaymentSource
  readonly detail: EconomicsDetail
  /** The capacity lease the request held: the settling statement deletes it. */
  readonly lease?: string | undefined
  /** The caller has its reply and nothing waits for the settlement: it may linger for its wallet's others (D573). */
  readonly linger?: boolean | undefined
}

/** What every settlement states, from a served request or from a reservation's durable record. */
type SettleFacts = Omit<ReceiptFacts, "epochId" | "paymentRef" | "settledOnCapture" | "settlesNothing"> & {
  readonly paidBy: PaidBy
  readonly source: PaymentSource
}

/** How a reservation's durable record says it was paid: the receipt's `PaidBy` and the capture's source. */
const paymentOf = (row: StaleReservation, prefixTokens: number) => {
  const funding: { readonly _tag: "X402" } | { readonly _tag: "Credit"; readonly keyId: string } =
    row.payment_kind === "credit" && row.key_id !== null
      ? { _tag: "Credit", keyId: row.key_id }
      : { _tag: "X402" }
  const x402 = { _tag: "X402", scheme: row.scheme ?? "exact" } as const
  if (row.payment_kind === "session" && row.session_id !== null) {
    return {
      paidBy: { _tag: "Session", sessionId: row.session_id } satisfies PaidBy,
      source: { _tag: "SessionTurn", sessionId: row.session_id, prefixTokens } satisfies PaymentSource
    }
  }
  const paidBy: PaidBy = funding._tag === "Credit" ? funding : x402
  if (row.opens_session && row.session_id !== null) {
    return {
      paidBy,
      source: {
        _tag: "SessionOpening",
        sessionId: row.session_id,
        funding,
        prefixTokens
      } satisfies PaymentSource
    }
  }
  return { paidBy, source: funding._tag === "Credit" ? funding : (x402 satisfies PaymentSource) }
}

/**
 * The end of every paid request: its receipt and economics are built (by their one builder each)
 * and the reservation is captured at the metered charge, or released whole when nothing was
 * delivered. Settling is idempotent (a capture whose first commit went through does nothing the
 * second time) and never lost to a database fault, nor a wait for the caller: a write that fails
 * is tried twice more on the reply's path (at most 2 s in all), then the final meter is recorded on
 * the request's row and the write retried in the background; what the retry gives up on, or an
 * instance that dies, is settled from that record (`fromRecord`) by the reaper or on restart (D211).
 */
export class Settle extends Context.Service<
  Settle,
  {
    /**
     * True once the settling statement ran (now or before); false when it was handed to the background
     * retry (the final meter is on record; the statement, when it lands, deletes the lease too).
     */
    readonly request: (served: Served) => Effect.Effect<boolean>
    /** Records what a request being served has delivered so far: its durable record (`Metered.ts`). */
    readonly recordMeter: (requestId: string, record: MeterRecord) => Effect.Effect<void, SqlError.SqlError>
    /**
     * Settles an open reservation nobody is serving from its durable record: the recorded meter's
     * charge is captured (status `partial` unless the record says how it ended) and the rest released;
     * with no record (nothing was delivered, or nothing could be proven) it is released in full. A
     * receipt is issued either way.
     */
    readonly fromRecord: (row: StaleReservation) => Effect.Effect<void>
    /** Whether this instance is retrying the request's settlement in the background now. */
    readonly inRetry: (requestId: string) => boolean
  }
>()("router/ledger/Settle") {
  static readonly layer = Layer.effect(
    Settle,
    Effect.gen(function* () {
      const ledger = yield* Ledger
      const { epochSeconds } = yield* RouterConfig
      const background = yield* Effect.scope
      /** Requests whose settlement this instance is retrying in the background now. */
      const retrying = new Set<string>()

      const receiptFor = (facts: SettleFacts) => {
        // An `upto` authorization charged zero is released unsubmitted: there is nothing to settle.
        const settlesNothing =
          facts.paidBy._tag === "X402" && facts.paidBy.scheme === "upto" && facts.charged === 0
        return receiptOf({
          requestId: facts.requestId,
          createdAt: facts.createdAt,
          epochId: epochOf(facts.createdAt, epochSeconds),
          payer: facts.payer,
          providerId: facts.providerId,
          modelClass: facts.modelClass,
          tokens: facts.tokens,
          tariff: facts.tariff,
          charged: facts.charged,
          authorized: facts.authorized,
          paymentRef: paymentRefOf(facts.paidBy),
          // A funded key's or a session's charge is settled on its balance as it is captured.
          settledOnCapture: facts.paidBy._tag !== "X402" || settlesNothing,
          settlesNothing,
          status: facts.status,
          ttftMs: facts.ttftMs,
          sessionId: facts.sessionId,
          quotesCompeting: facts.quotesCompeting
        })
      }

      const write = (status: ReceiptBody["status"], record: CaptureRecord) =>
        (status === "released" ? ledger.release(record) : ledger.capture(record)).pipe(
          Effect.catchDefect((defect) => Effect.fail(defect)),
          Effect.tapError(() => Metric.update(settleRetries, 1))
        )

      /** The retry off the reply's path, after the final meter is on the row (each round records it again until it lands). */
      const retryInBackground = (served: Served, attempt: Effect.Effect<void, unknown>) =>
        Effect.andThen(
          ledger
            .recordMeter(
              served.requestId,
              meterRecordOf({
                charged: served.charged,
                tokens: served.tokens,
                providerId: served.servedBy.provider_id,
                modelClass: served.servedBy.model_class,
                tariff: served.auction.clear,
                ttftMs: served.ttftMs,
                status: served.status,
                final: true
              })
            )
            .pipe(Effect.ignore),
          attempt
        ).pipe(
          Effect.retry({ schedule: BACKGROUND_RETRY, times: BACKGROUND_RETRIES }),
          Effect.catch((cause) =>
            Effect.andThen(
              Metric.update(settleAbandoned, 1),
              Effect.logError("settlement given up after retries; it is settled from its record", {
                request_id: served.requestId,
                status: served.status,
                cause: String(cause)
              })
            )
          ),
          Effect.ensuring(Effect.sync(() => retrying.delete(served.requestId))),
          Effect.withSpan("Settle.retry", { attributes: { request_id: served.requestId } }),
          Effect.forkIn(background),
          Effect.asVoid,
          (fork) =>
            Effect.andThen(
              Effect.sync(() => retrying.add(served.requestId)),
              fork
            )
        )

      const request = (served: Served) => {
        const receipt = receiptFor({
          requestId: served.requestId,
          createdAt: served.createdAt,
          payer: served.payer,
          providerId: served.servedBy.provider_id,
          modelClass: served.servedBy.model_class,
          tokens: served.tokens,
          tariff: served.auction.clear,
          charged: served.charged,
          authorized: served.authorized,
          status: served.status,
          ttftMs: served.ttftMs,
          paidBy: served.paidBy,
          source: served.source,
          sessionId: served.detail._tag === "Tokens" ? served.detail.sessionId : null,
          quotesCompeting: served.auction.eligible
        })
        const economics = economicsOf({
          requestId: served.requestId,
          auction: served.auction,
          servedBy: served.servedBy,
          tokens: served.tokens,
          charged: served.charged,
          authorized: served.authorized,
          ttftMs: served.ttftMs,
          detail: served.detail
        })
        const attempt = write(served.status, {
          receipt,
          economics,
          source: served.source,
          lease: served.lease,
          linger: served.linger
        })
        return attempt.pipe(
          Effect.as(true),
          retryAfterFailure({ schedule: INLINE_RETRY, times: INLINE_RETRIES }),
          (retried) => within(retried, INLINE_BOUND_MS),
          // Never silent, never a held caller: the caller gets its answer now, the write is retried
          // in the background from the final meter recorded on the row, counted in /metrics.
          Effect.catch((cause) =>
            Effect.gen(function* () {
              yield* Metric.update(settleDeferred, 1)
              yield* Effect.logWarning("settlement deferred to the background after a database fault", {
                request_id: served.requestId,
                status: served.status,
                cause: String(cause)
              })
              yield* retryInBackground(served, attempt)
              return false
            })
          ),
          traced("Settle.request", { attributes: { request_id: served.requestId, status: served.status } })
        )
      }

      const fromRecord = (row: StaleReservation) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const metered = row.metered
          // An x402 authorization that expires before a transfer could land collects nothing: released
          // whole, as before there was a record (its signature erased, no refund owed).
          const collectable =
            row.valid_before === null ||
            BigInt(row.valid_before) > BigInt(Math.floor(now / 1000) + COLLECT_RUNWAY_S)
          const delivered = collectable && metered !== null && metered.status !== "released"
          const tokens = delivered ? metered.tokens : { input: 0, cachedInput: 0, output: 0 }
          const { paidBy, source } = paymentOf(row, tokens.input + tokens.output)
          const status: ReceiptBody["status"] = !delivered
            ? "released"
            : metered.final && metered.status === "ok"
              ? "ok"
              : "partial"
          const receipt = receiptFor({
            requestId: row.request_id,
            createdAt: Math.floor(row.created_at),
            payer: row.payer,
            providerId: delivered ? metered.provider_id : row.provider_id,
            modelClass: delivered ? metered.model_class : row.model_class,
            tokens,
            // Released: zero tokens at no tariff, nothing anyone can prove was served.
            tariff: delivered ? metered.tariff : { price_in: 0, price_out: 0 },
            charged: delivered ? Math.min(metered.charged, row.authorized) : 0,
            authorized: row.authorized,
            status,
            ttftMs: delivered ? metered.ttft_ms : 0,
            paidBy,
            source,
            sessionId: row.session_id,
            quotesCompeting: 0
          })
          // No auction is at hand to state the economics of: the record says it was settled after its request.
          const record = { receipt, economics: { request_id: row.request_id, reaped: true as const }, source }
          return (status === "released" ? ledger.release(record) : ledger.capture(record)).pipe(
            Effect.andThen(delivered ? Metric.update(settledFromRecord, 1) : Effect.void),
            Effect.withSpan("Settle.fromRecord", { attributes: { request_id: row.request_id, status } })
          )
        })

      return Settle.of({
        request,
        recordMeter: ledger.recordMeter,
        fromRecord,
        inRetry: (requestId) => retrying.has(requestId)
      })
    })
  )

  /** Hands every settlement to `record` instead of the ledger, for tests of what settles. */
  static readonly layerTest = (record: (served: Served) => Effect.Effect<void>) =>
    Layer.succeed(
      Settle,
      Settle.of({
        request: (served) => Effect.as(record(served), true),
        recordMeter: () => Effect.void,
        fromRecord: () => Effect.void,
        inRetry: () => false
      })
    )
}
