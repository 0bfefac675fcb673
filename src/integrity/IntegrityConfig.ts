import { Config, Context, Effect, Layer } from "effect"
import { gated } from "../domain/Errors.ts"

/**
 * The model-integrity program's switch. At launch the program runs in shadow: claims, challengers and
 * points are live, the challenge quote and filing answer `feature_gated` until the operator sets
 * `MODEL_INTEGRITY_CHALLENGES=true` (docs/decisions.md D69).
 */
export class IntegrityConfig extends Context.Service<
  IntegrityConfig,
  { readonly challengesEnabled: boolean }
>()("router/integrity/IntegrityConfig") {
  static readonly layer = Layer.effect(
    IntegrityConfig,
    Effect.map(
      Config.Boolean("MODEL_INTEGRITY_CHALLENGES").pipe(Config.withDefault(false)),
      (challengesEnabled) => IntegrityConfig.of({ challengesEnabled })
    )
  )
}

/** The D55 answer of the challenge quote and filing while the program is off. */
export const challengesGated = () => gated("model_integrity_challenges")
