import { Context, Effect, Layer, Metric, Schedule } from "effect"
import type { TokenCounts } from "../domain/Billing.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import type { AuctionCleared, RankedBid } from "../market/Auction.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { epochOf } from "./Epochs.ts"
import { Ledger, type PaymentSource } from "./Ledger.ts"
import { type EconomicsDetail, economicsOf, type PaidBy, paymentRefOf, receiptOf } from "./Records.ts"

/** Settlement writes that failed and were tried again (a database fault under a capture or release). */
export const settleRetries = Metric.counter("svc_settle_retries_total", {
  description: "Captures and releases retried after a database fault",
  incremental: true
})

/**
 * Settlements given up after every retry: the request stays `reserved` in the ledger (its durable
 * record) and is released in full by the reaper; the caller still gets its answer.
 */
export const settleAbandoned = Metric.counter("svc_settle_abandoned_total", {
  description: "Captures and releases given up after every retry (the reaper releases them)",
  incremental: true
})

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
}

/**
 * The end of every paid request: its receipt and economics are built (by their one builder each)
 * and the reservation is captured at the metered charge, or released whole when nothing was
 * delivered. Settling must not be lost to a passing database fault: it is retried, and it is
 * idempotent (a capture whose first commit went through does nothing the second time).
 */
export class Settle extends Context.Service<
  Settle,
  {
    /** True once the settling statement ran (now or before); false when it was given up to the reaper. */
    readonly request: (served: Served) => Effect.Effect<boolean>
  }
>()("router/ledger/Settle") {
  static readonly layer = Layer.effect(
    Settle,
    Effect.gen(function* () {
      const ledger = yield* Ledger
      const { epochSeconds } = yield* RouterConfig

      const request = (served: Served) => {
        // An `upto` authorization charged zero is released unsubmitted: there is nothing to settle.
        const settlesNothing =
          served.paidBy._tag === "X402" && served.paidBy.scheme === "upto" && served.charged === 0
        const receipt = receiptOf({
          requestId: served.requestId,
          createdAt: served.createdAt,
          epochId: epochOf(served.createdAt, epochSeconds),
          payer: served.payer,
          providerId: served.servedBy.provider_id,
          modelClass: served.servedBy.model_class,
          tokens: served.tokens,
          tariff: served.auction.clear,
          charged: served.charged,
          authorized: served.authorized,
          paymentRef: paymentRefOf(served.paidBy),
          // A funded key's or a session's charge is settled on its balance as it is captured.
          settledOnCapture: served.paidBy._tag !== "X402" || settlesNothing,
          settlesNothing,
          status: served.status,
          ttftMs: served.ttftMs,
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
        const record = { receipt, economics, source: served.source, lease: served.lease }
        return (served.status === "released" ? ledger.release(record) : ledger.capture(record)).pipe(
          Effect.as(true),
          Effect.catchDefect((defect) => Effect.fail(defect)),
          Effect.tapError(() => Metric.update(settleRetries, 1)),
          Effect.retry({ schedule: Schedule.exponential("100 millis"), times: 8 }),
          // Never silent, never a hung caller: the request stays `reserved` (the reaper releases it
          // in full), the give-up is counted in /metrics and logged with its request id.
          Effect.catch((cause) =>
            Effect.andThen(
              Metric.update(settleAbandoned, 1),
              Effect.logError("settlement given up after retries; the reaper will release it", {
                request_id: served.requestId,
                status: served.status,
                cause: String(cause)
              })
            ).pipe(Effect.as(false))
          ),
          Effect.withSpan("Settle.request", {
            attributes: { request_id: served.requestId, status: served.status }
          })
        )
      }

      return Settle.of({ request })
    })
  )

  /** Hands every settlement to `record` instead of the ledger, for tests of what settles. */
  static readonly layerTest = (record: (served: Served) => Effect.Effect<void>) =>
    Layer.succeed(Settle, Settle.of({ request: (served) => Effect.as(record(served), true) }))
}
