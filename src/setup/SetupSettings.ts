import { Config, Context, Effect, Layer, Schema } from "effect"
import { Chain } from "../chain/Chain.ts"
import { RouterConfig } from "../RouterConfig.ts"

export interface SetupSettingsShape {
  /** Where the approval page is served: `<publicUrl>/setup`. */
  readonly publicUrl: string
  readonly chainId: number
  /** CAIP-2 network of the router's chain, e.g. `eip155:8453`: the only network a setup can name. */
  readonly network: string
  /** RFC 8628 `interval`: the least seconds between two polls of the token endpoint. */
  readonly intervalSeconds: number
  /** How long a setup waits for its approval and exchange. */
  readonly setupTtlSeconds: number
  /** The issued key's lifetime when the request names none, and the bounds of what it may name. */
  readonly keyTtl: { readonly default: number; readonly min: number; readonly max: number }
}

const HOUR = 3600
const DAY = 24 * HOUR

export const defaultSetupSettings = {
  intervalSeconds: 5,
  setupTtlSeconds: 600,
  keyTtl: { default: 30 * DAY, min: HOUR, max: 90 * DAY }
} as const

/** Settings of the device-flow setup (spec 4.5); the network comes from the chain the router settles on. */
export class SetupSettings extends Context.Service<SetupSettings, SetupSettingsShape>()(
  "router/setup/SetupSettings"
) {
  static readonly layer = Layer.effect(
    SetupSettings,
    Effect.gen(function* () {
      const chain = yield* Chain
      const { publicUrl } = yield* RouterConfig
      const seconds = (name: string, fallback: number, max: number) =>
        Config.schema(Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: max })), name).pipe(
          Config.withDefault(fallback)
        )
      return SetupSettings.of({
        publicUrl,
        chainId: chain.chainId,
        network: chain.network,
        intervalSeconds: yield* seconds(
          "AGENT_SETUP_INTERVAL_SECONDS",
          defaultSetupSettings.intervalSeconds,
          60
        ),
        setupTtlSeconds: yield* seconds(
          "AGENT_SETUP_TTL_SECONDS",
          defaultSetupSettings.setupTtlSeconds,
          3600
        ),
        keyTtl: defaultSetupSettings.keyTtl
      })
    })
  )

  static readonly test = (overrides: Partial<SetupSettingsShape> = {}) =>
    Layer.succeed(
      SetupSettings,
      SetupSettings.of({
        publicUrl: "http://127.0.0.1:8402",
        chainId: 31337,
        network: "eip155:31337",
        ...defaultSetupSettings,
        ...overrides
      })
    )
}
