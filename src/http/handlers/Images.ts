import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import { auctionSvc, paidHeaders } from "../../inference/ChatEncoding.ts"
import { IMAGE_PRICE_UNIT, Images } from "../../inference/Images.ts"
import { RouterConfig } from "../../RouterConfig.ts"
import { Api } from "../Api.ts"
import { paidContextOf } from "../PaidCall.ts"
import { leanGroup } from "./LeanGroup.ts"

export const ImagesHandlers = leanGroup(
  Effect.gen(function* () {
    const images = yield* Images
    const chain = yield* Chain
    const config = yield* RouterConfig
    return HttpApiBuilder.group(Api, "images", (handlers) =>
      handlers.handle("generateImage", ({ payload, request }) =>
        Effect.gen(function* () {
          const context = paidContextOf(request, "openai", `${config.publicUrl}/v1/images/generations`)
          const agent = context.agent
          const generated = yield* images.generate(payload, {
            paymentHeader: context.paymentHeader,
            creditKey: context.creditKey,
            sessionToken: context.sessionToken,
            idempotencyKey: request.headers["idempotency-key"],
            resourceUrl: context.resourceUrl,
            agent
          })
          return HttpServerResponse.jsonUnsafe(
            {
              created: Math.floor(generated.createdAt / 1000),
              data: [generated.image],
              svc: {
                ...auctionSvc(
                  generated.auction,
                  generated.requestId,
                  generated.requestedModel,
                  undefined,
                  IMAGE_PRICE_UNIT
                ),
                images: 1,
                charged: generated.price,
                authorized: generated.authorized
              }
            },
            { headers: paidHeaders(generated, agent, chain.network) }
          )
        })
      )
    )
  })
)
