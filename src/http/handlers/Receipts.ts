import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder } from "effect/http-api"
import { LiveStreams, SETTLED_WAIT_MS } from "../../inference/LiveStreams.ts"
import { Receipts } from "../../ledger/Receipts.ts"
import { Api } from "../Api.ts"
import { leanGroup } from "./LeanGroup.ts"

// Lean (D537, D540): a caller that verifies reads its receipt after every paid call.
export const ReceiptHandlers = leanGroup(
  Effect.gen(function* () {
    const receipts = yield* Receipts
    const live = yield* LiveStreams
    // A reply can reach its caller before its settlement commits (D534): a read of what a request this
    // process served settled waits for that settlement first. One it is still serving has nothing settled
    // yet: it is read at once, without the book's wait for another instance's settlement.
    const settled = (id: string) => live.awaitDone(id, SETTLED_WAIT_MS)
    const mayBeSettling = (id: string) => {
      const stream = live.get(id)
      return stream === undefined || stream.finishedAt !== undefined
    }
    return HttpApiBuilder.group(Api, "receipts", (handlers) =>
      handlers
        .handle("receipt", ({ params }) =>
          Effect.andThen(
            settled(params.id),
            Effect.suspend(() => receipts.receipt(params.id, mayBeSettling(params.id)))
          )
        )
        .handle("economics", ({ params }) =>
          // The record as stored, byte for byte (its schema documents it; see ChatApi).
          Effect.andThen(
            settled(params.id),
            Effect.suspend(() =>
              Effect.map(receipts.economics(params.id, mayBeSettling(params.id)), (body) =>
                HttpServerResponse.jsonUnsafe(body)
              )
            )
          )
        )
    )
  })
)
