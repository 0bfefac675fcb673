import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { gated } from "../../domain/Errors.ts"
import { Api } from "../Api.ts"

export const GatedHandlers = HttpApiBuilder.group(Api, "gated", (handlers) =>
  handlers
    .handleRaw("embeddings", () => Effect.fail(gated("embeddings")))
    .handle("getPassport", () => Effect.fail(gated("context_passports")))
    .handle("deletePassport", () => Effect.fail(gated("context_passports")))
    .handleRaw("createOrder", () => Effect.fail(gated("patient_orders")))
    .handle("getOrder", () => Effect.fail(gated("patient_orders")))
    .handleRaw("cancelOrder", () => Effect.fail(gated("patient_orders")))
)
