import { Context, Effect, Layer } from "effect"
import { Chain } from "../chain/Chain.ts"
import { NotFound } from "../domain/Errors.ts"
import { type ReceiptReply, receiptTypedDataJson } from "../domain/Receipt.ts"
import { Epochs } from "./Epochs.ts"
import { Ledger } from "./Ledger.ts"

const notFound = (id: string) => new NotFound({ code: "request_not_found", message: `No request ${id}` })

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

      const receipt = Effect.fn("Receipts.receipt")(function* (requestId: string) {
        const found = yield* ledger.receipt(requestId)
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
        const body = yield* ledger.economics(requestId)
        if (body === undefined) return yield* notFound(requestId)
        return body
      })

      return Receipts.of({ receipt, economics })
    })
  )
}
