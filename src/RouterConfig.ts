import { randomBytes } from "node:crypto"
import { Config, Context, Effect, Layer, Option, Redacted } from "effect"

/**
 * Process-wide settings read once at start. Secrets are `Redacted`; anything chain- or
 * database-specific is read by the layer that owns that resource.
 */
export interface RouterSettings {
  readonly port: number
  readonly host: string
  readonly publicUrl: string
  readonly operatorToken: Redacted.Redacted<string>
  /** True when the token was generated for this run (dev): it is printed in the banner. */
  readonly operatorTokenGenerated: boolean
  readonly dataDir: string
  readonly epochSeconds: number
  readonly maxBodyBytes: number
  /** Mainnet configuration makes a failed reconciliation fail readiness (spec 7). */
  readonly mainnet: boolean
  /** Paid requests admitted at once, and how long one waits for its turn before `503 router_busy` (D531). */
  readonly admission: { readonly concurrency: number; readonly waitSeconds: number }
}

export class RouterConfig extends Context.Service<RouterConfig, RouterSettings>()("router/RouterConfig") {
  static readonly layer = Layer.effect(
    RouterConfig,
    Effect.gen(function* () {
      const port = yield* Config.Port("PORT").pipe(Config.withDefault(8402))
      const host = yield* Config.String("HOST").pipe(Config.withDefault("127.0.0.1"))
      const publicUrl = yield* Config.String("PUBLIC_URL").pipe(Config.option)
      const token = yield* Config.Redacted("OPERATOR_TOKEN").pipe(Config.option)
      const dataDir = yield* Config.String("DATA_DIR").pipe(Config.withDefault(".data"))
      const epochSeconds = yield* Config.Int("EPOCH_SECONDS").pipe(Config.withDefault(3600))
      const maxBodyBytes = yield* Config.Int("MAX_BODY_BYTES").pipe(Config.withDefault(4 * 1024 * 1024))
      const mainnet = yield* Config.Boolean("MAINNET").pipe(Config.withDefault(false))
      const concurrency = yield* Config.Int("ADMISSION_CONCURRENCY").pipe(Config.withDefault(32))
      const waitSeconds = yield* Config.Int("ADMISSION_WAIT_SECONDS").pipe(Config.withDefault(60))
      return RouterConfig.of({
        port,
        host,
        publicUrl: Option.getOrElse(publicUrl, () => `http://${host}:${port}`),
        operatorToken: Option.getOrElse(token, () => Redacted.make(randomBytes(24).toString("base64url"))),
        operatorTokenGenerated: Option.isNone(token),
        dataDir,
        epochSeconds,
        maxBodyBytes,
        mainnet,
        admission: { concurrency: Math.max(1, concurrency), waitSeconds: Math.max(0, waitSeconds) }
      })
    })
  )

  static readonly layerTest = (overrides: Partial<RouterSettings> = {}) =>
    Layer.succeed(
      RouterConfig,
      RouterConfig.of({
        port: 0,
        host: "127.0.0.1",
        publicUrl: "http://127.0.0.1:0",
        operatorToken: Redacted.make("test-operator-token"),
        operatorTokenGenerated: false,
        dataDir: ".test-data",
        epochSeconds: 3600,
        maxBodyBytes: 4 * 1024 * 1024,
        mainnet: false,
        admission: { concurrency: 32, waitSeconds: 60 },
        ...overrides
      })
    )
}
