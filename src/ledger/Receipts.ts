import { Clock, Context, Effect, Layer } from "effect"
import { Chain } from "../chain/Chain.ts"
import { NotFound } from "../domain/Errors.ts"
import { type ReceiptReply, receiptTypedDataJson } from "../domain/Receipt.ts"
import { Epochs } from "./Epochs.ts"
import { Ledger } from "./Ledger.ts"

const notFound = (id: string) => new NotFound({ code: "request_not_found", message: `No request ${id}` })

/**
 * How long a read of a request still `reserved` waits for its settlement, and how often it looks: the reply
 * can reach its caller before the settlement commits (D534), and the instance that served it may be another
 * one (the one that served it waits for its own settlement, `LiveStreams.awaitDone`).
 */
const SETTLING_WAIT_MS = 2_000
const SETTLING_LOOK_MS = 25

/**
 * The public reads of the book of record: a request's signed receipt (with the typed data a client
 * verifies it with, and its inclusion proof once its epoch is anchored) and its economics.
 */
export class Receipts extends Context.Service<
  Receipts,
  {
    readonly receipt: (requestId: string) => Effect.Effect<ReceiptReply, NotFound>
    /** The economics record as stored (an `EconomicsRecord`, `domain/Economics.ts`). */
    readonly economics: (requestId: string) => Effect.Effect<unknown, NotFound>
  }
>()("router/ledger/Receipts") {
  static readonly layer = Layer.effect(
    Receipts,
    Effect.gen(function* () {
      const ledger = yield* Ledger
      const epochs = yield* Epochs
      const chain = yield* Chain

      /**
       * `read` of a request, looked at again while the request is still `reserved` (its settlement may be
       * committing on another instance), up to `SETTLING_WAIT_MS`; undefined if it never appears.
       */
      const settled = <A>(requestId: string, read: Effect.Effect<A | undefined>) =>
        Effect.gen(function* () {
          const deadline = (yield* Clock.currentTimeMillis) + SETTLING_WAIT_MS
          for (;;) {
            const found = yield* read
            if (found !== undefined || (yield* Clock.currentTimeMillis) >= deadline) return found
            if (!(yield* ledger.reserved(requestId))) return yield* read
            yield* Effect.sleep(SETTLING_LOOK_MS)
          }
        })

      const receipt = Effect.fn("Receipts.receipt")(function* (requestId: string) {
        const found = yield* settled(requestId, ledger.receipt(requestId))
        if (found === undefined) return yield* notFound(requestId)
        const inclusion = yield* epochs.inclusion(requestId)
        return {
          receipt: found.body,
          final: found.final,
          signature: found.signature,
          signer: chain.routerSigner,
          typed_data: receiptTypedDataJson(found.body, chain.chainId),
          inclusion: inclusion ?? null
        } satisfies ReceiptReply
      })

      const economics = Effect.fn("Receipts.economics")(function* (requestId: string) {
        const body = yield* settled(requestId, ledger.economics(requestId))
        if (body === undefined) return yield* notFound(requestId)
        return body
      })

      return Receipts.of({ receipt, economics })
    })
  )
}
