import { Effect, Layer } from "effect"
import { HttpApiMiddleware } from "effect/http-api"
import { FeatureGated } from "../domain/Errors.ts"
import { challengesGated, IntegrityConfig } from "../integrity/IntegrityConfig.ts"
import { openAi } from "./ErrorWire.ts"

/**
 * The challenge quote and filing answer `feature_gated` before anything else (D55, D69): the
 * middleware runs before the query or body is decoded, so with the program off no input is read.
 */
export class ChallengesGate extends HttpApiMiddleware.Service<ChallengesGate>()(
  "router/http/ChallengesGate",
  {
    error: openAi(FeatureGated)
  }
) {}

export const ChallengesGateLive = Layer.effect(
  ChallengesGate,
  IntegrityConfig.useSync((config) =>
    ChallengesGate.of((httpEffect) =>
      config.challengesEnabled ? httpEffect : Effect.fail(challengesGated())
    )
  )
)
