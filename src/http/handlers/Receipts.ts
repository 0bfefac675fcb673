import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder } from "effect/http-api"
import { Receipts } from "../../ledger/Receipts.ts"
import { Api } from "../Api.ts"

export const ReceiptHandlers = HttpApiBuilder.group(
  Api,
  "receipts",
  Effect.fn(function* (handlers) {
    const receipts = yield* Receipts
    return handlers
      .handle("receipt", ({ params }) => receipts.receipt(params.id))
      .handle("economics", ({ params }) =>
        // The record as stored, byte for byte (its schema documents it; see ChatApi).
        Effect.map(receipts.economics(params.id), (body) => HttpServerResponse.jsonUnsafe(body))
      )
  })
)
