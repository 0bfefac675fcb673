import { timingSafeEqual } from "node:crypto"
import { Effect, Layer, Redacted } from "effect"
import { HttpApiMiddleware, HttpApiSecurity } from "effect/http-api"
import { Unauthorized } from "../domain/Errors.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { openAi } from "./ErrorWire.ts"

/** `Authorization: Bearer <OPERATOR_TOKEN>` on every `/v1/admin/*` endpoint. */
export class OperatorAuth extends HttpApiMiddleware.Service<OperatorAuth>()("router/http/OperatorAuth", {
  security: { bearer: HttpApiSecurity.bearer },
  error: openAi(Unauthorized)
}) {}

const constantTimeEqual = (a: string, b: string) => {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}

export const OperatorAuthLive = Layer.effect(
  OperatorAuth,
  Effect.gen(function* () {
    const config = yield* RouterConfig
    const expected = Redacted.value(config.operatorToken)
    return OperatorAuth.of({
      bearer: (httpEffect, { credential }) =>
        constantTimeEqual(Redacted.value(credential), expected)
          ? httpEffect
          : Effect.fail(
              new Unauthorized({
                code: "invalid_operator_token",
                message: "Missing or invalid operator token"
              })
            )
    })
  })
)
