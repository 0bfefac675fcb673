import { Context, Effect, Layer } from "effect"
import type { Forbidden, Unauthorized } from "../domain/Errors.ts"
import { Keys } from "./Keys.ts"

/** A spend-capable funded key, as the paid path needs it. */
export interface CreditKey {
  readonly keyId: string
  readonly wallet: string
  readonly label: string
  readonly budget: number
  readonly spent: number
  readonly reserved: number
}

/**
 * Resolves an `x-credit-key` secret to its key: 401 unknown or revoked, 403 when the key
 * cannot spend or its owner is not invited. Implemented by the key registry.
 */
export class CreditKeys extends Context.Service<
  CreditKeys,
  { readonly resolve: (secret: string) => Effect.Effect<CreditKey, Unauthorized | Forbidden> }
>()("router/payment/CreditKeys") {
  /** Backed by the key registry (`Keys`). */
  static readonly layer = Layer.effect(
    CreditKeys,
    Effect.map(Effect.service(Keys), (keys) =>
      CreditKeys.of({
        resolve: (secret) =>
          Effect.map(keys.resolveCreditKey(secret), (key) => ({
            keyId: key.keyId,
            wallet: key.wallet,
            label: key.label,
            budget: key.budget,
            spent: key.spent,
            reserved: key.reserved
          }))
      })
    )
  )
}
