import { Clock, Context, Effect, Layer } from "effect"
import { Chain } from "../chain/Chain.ts"
import { NotFound } from "../domain/Errors.ts"
import { type ReceiptReply, receiptTypedDataJson } from "../domain/Receipt.ts"
import { Epochs } from "./Epochs.ts"
import { Ledger } from "./Ledger.ts"

const notFound = (id: string) => new NotFound({ code: "request_not_found", message: `No request ${id}` })

/**
 * How long a read of a request still `reserved` waits for its settlement, and when it looks again (25 ms,
 * then twice as long each time: six looks within the bound): the reply can reach its caller before the
 * settlement commits (D534), and the instance that served it may be another one (the one that served it
 * waits for its own settlement, `LiveStreams.awaitDone`).
 */
const SETTLING_WAIT_MS = 2_000
const SETTLING_FIRST_LOOK_MS = 25

/**
 * The public reads of the book of record: a request's signed receipt (with the typed data a client
 * verifies it with, and its inclusion proof once its epoch is anchored) and its economics.
 */
export class Receipts extends Context.Service<
  Receipts,
  {
    /**
     * `waitWhileReserved` (default true): while the request is still `reserved`, look again for up to 2 s;
     * false for a request this instance is still serving (nothing settled to wait for).
     */
    readonly receipt: (
      requestId: string,
      waitWhileReserved?: boolean
    ) => Effect.Effect<ReceiptReply, NotFound>
    /** The economics record as stored (an `EconomicsRecord`, `domain/Economics.ts`); as `receipt`. */
    readonly economics: (requestId: string, waitWhileReserved?: boolean) => Effect.Effect<unknown, NotFound>
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
      const settled = <A>(requestId: string, read: Effect.Effect<A | undefined>, wait: boolean) =>
        Effect.gen(function* () {
          const found = yield* read
          if (found !== undefined || !wait) return found
          // Each look asks only whether it is still reserved; what it settled is read once, when it is not.
          const deadline = (yield* Clock.currentTimeMillis) + SETTLING_WAIT_MS
          for (let look = SETTLING_FIRST_LOOK_MS; ; look *= 2) {
            if (!(yield* ledger.reserved(requestId))) return yield* read
            if ((yield* Clock.currentTimeMillis) + look > deadline) return undefined
            yield* Effect.sleep(look)
          }
        })

      const receipt = Effect.fn("Receipts.receipt")(function* (requestId: string, waitWhileReserved = true) {
        const found = yield* settled(requestId, ledger.receipt(requestId), waitWhileReserved)
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

      const economics = Effect.fn("Receipts.economics")(function* (
        requestId: string,
        waitWhileReserved = true
      ) {
        const body = yield* settled(requestId, ledger.economics(requestId), waitWhileReserved)
        if (body === undefined) return yield* notFound(requestId)
        return body
      })

      return Receipts.of({ receipt, economics })
    })
  )
}
