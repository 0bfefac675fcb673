import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import { NotFound } from "../../domain/Errors.ts"
import { receiptTypedDataJson } from "../../domain/Receipt.ts"
import { Epochs } from "../../ledger/Epochs.ts"
import { Ledger } from "../../ledger/Ledger.ts"
import { Api } from "../Api.ts"

export const ReceiptHandlers = HttpApiBuilder.group(
  Api,
  "receipts",
  Effect.fn(function* (handlers) {
    const ledger = yield* Ledger
    const chain = yield* Chain
    const epochs = yield* Epochs
    const notFound = (id: string) => new NotFound({ code: "request_not_found", message: `No request ${id}` })
    return handlers
      .handle("receipt", ({ params }) =>
        Effect.gen(function* () {
          const found = yield* ledger.receipt(params.id)
          if (found === undefined) return yield* notFound(params.id)
          const inclusion = yield* epochs.inclusion(params.id)
          return {
            receipt: found.body,
            final: found.final,
            signature: found.signature,
            signer: chain.routerSigner,
            typed_data: receiptTypedDataJson(found.body, chain.chainId),
            inclusion: inclusion ?? null
          }
        })
      )
      .handle("economics", ({ params }) =>
        Effect.gen(function* () {
          const body = yield* ledger.economics(params.id)
          if (body === undefined) return yield* notFound(params.id)
          return body
        })
      )
  })
)
