import { Clock, Context, Effect, Layer } from "effect"
import { type AuctionOutcome, type AuctionRequest, runAuction } from "./Auction.ts"
import { Latency } from "./Latency.ts"
import { ModelCatalog } from "./ModelCatalog.ts"
import { QuoteBook } from "./QuoteBook.ts"
import { TaskFitEvidence } from "./TaskFit.ts"

export type MarketRequest = Omit<AuctionRequest, "nowMs" | "taskFit"> & {
  /** The request's task label (`routing.task`): its rating evidence moves class quality in the score. */
  readonly task?: string | undefined
  /** Opening a budget session: only quotes that sign a session tariff (cached price and TTL) compete. */
  readonly requireSessionTariff?: boolean | undefined
  /** Only quotes of these classes are asked (image requests ask image classes only). */
  readonly onlyClasses?: ((modelClass: string) => boolean) | undefined
}

/**
 * The RFQ step: a funded request for quotes to the live standing quotes (with this instance's view of
 * their in-flight counts, so a quote at its signed capacity does not compete), the measured latency,
 * the catalog and the task's rating evidence (when the request names a task), into the pure auction
 * (award, then clear).
 */
export class Rfq extends Context.Service<
  Rfq,
  { readonly run: (request: MarketRequest) => Effect.Effect<AuctionOutcome> }
>()("router/market/Rfq") {
  static readonly layer = Layer.effect(
    Rfq,
    Effect.gen(function* () {
      const book = yield* QuoteBook
      const latency = yield* Latency
      const catalog = yield* ModelCatalog
      const taskFits = yield* TaskFitEvidence
      const run = Effect.fnUntraced(function* (request: MarketRequest) {
        const { requireSessionTariff, onlyClasses, task, ...auctionRequest } = request
        const nowMs = yield* Clock.currentTimeMillis
        const live = yield* book.live
        const quotes = live.filter(
          (q) =>
            (onlyClasses === undefined || onlyClasses(q.quote.model_class)) &&
            (!requireSessionTariff ||
              (q.quote.price_in_cached !== undefined && q.quote.session_ttl_s !== undefined))
        )
        const lookup = yield* latency.lookup
        const taskFit = task === undefined ? undefined : yield* taskFits.forTask(task)
        const outcome = runAuction({ ...auctionRequest, taskFit, nowMs }, quotes, catalog.classes, lookup)
        yield* Effect.annotateCurrentSpan(
          outcome._tag === "Cleared"
            ? {
                requested: request.requested,
                winner: outcome.winner.provider_id,
                model_class: outcome.winner.model_class,
                price_setter: outcome.priceSetter,
                quotes_competing: outcome.eligible
              }
            : { requested: request.requested, no_eligible_quote: outcome.reason }
        )
        return outcome
      })
      return Rfq.of({ run })
    })
  )
}
