import { Context, Duration, Effect, Layer, type Redacted, Ref, Schedule } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import type { Address } from "viem"
import { defaultFleet, type ProviderConfig, simulationAccount } from "./FleetConfig.ts"
import * as ProviderServer from "./ProviderServer.ts"
import { freshQuote } from "./Quotes.ts"

export interface FleetProvider extends ProviderServer.ProviderServerHandle {
  readonly config: ProviderConfig
  readonly signer: Address
}

export interface FleetStats {
  /** Completed register-and-quote cycles. */
  readonly cycles: number
  readonly registrations: number
  readonly quotesAccepted: number
  readonly quotesRejected: number
  /** Calls that failed to reach the router (after retries). */
  readonly unreachable: number
}

export interface FleetOptions {
  readonly routerUrl: string
  readonly operatorToken: Redacted.Redacted<string>
  /** Quote refresh period; at most 10 s (quotes live 30 s). Default 8 s. */
  readonly refreshMs?: number | undefined
  /** Defaults to `defaultFleet`. */
  readonly providers?: ReadonlyArray<ProviderConfig> | undefined
}

const defaultRefreshMs = 8_000
const maxRefreshMs = 10_000
const retryMs = 1_000

const emptyStats: FleetStats = {
  cycles: 0,
  registrations: 0,
  quotesAccepted: 0,
  quotesRejected: 0,
  unreachable: 0
}

const make = Effect.fn("Fleet.make")(function* (options: FleetOptions) {
  const configs = options.providers ?? defaultFleet
  const refreshMs = Math.min(options.refreshMs ?? defaultRefreshMs, maxRefreshMs)

  const providers: ReadonlyArray<FleetProvider> = yield* Effect.forEach(configs, (config) =>
    ProviderServer.make({
      providerId: config.providerId,
      dialect: config.dialect,
      modelClasses: config.offers.map((o) => o.modelClass),
      ttftMs: config.ttftMs,
      tokensPerSecond: config.tokensPerSecond,
      maxContext: config.maxContext,
      faults: config.faults
    }).pipe(
      Effect.map((handle) => ({ ...handle, config, signer: simulationAccount(config.providerId).address }))
    )
  )

  const client = (yield* HttpClient.HttpClient).pipe(
    HttpClient.mapRequest(HttpClientRequest.prependUrl(options.routerUrl.replace(/\/+$/, ""))),
    HttpClient.transformResponse(Effect.timeout(Duration.seconds(5))),
    HttpClient.retryTransient({ schedule: Schedule.exponential(Duration.millis(200)), times: 2 })
  )

  const stats = yield* Ref.make(emptyStats)
  const bump = (key: keyof FleetStats) => Ref.update(stats, (s) => ({ ...s, [key]: s[key] + 1 }))
  const registered = yield* Ref.make<ReadonlySet<string>>(new Set())
  const setRegistered = (id: string, value: boolean) =>
    Ref.update(registered, (set) => {
      const next = new Set(set)
      if (value) next.add(id)
      else next.delete(id)
      return next
    })

  /** POST a JSON body; the status when the router answered, undefined when it could not be reached. */
  const post = (path: string, body: unknown, withToken: boolean) =>
    HttpClientRequest.post(path).pipe(
      HttpClientRequest.bodyJsonUnsafe(body),
      withToken ? HttpClientRequest.bearerToken(options.operatorToken) : (r) => r,
      client.execute,
      Effect.flatMap((response) =>
        response.status < 300
          ? Effect.succeed({ status: response.status, detail: "" })
          : response.text.pipe(
              Effect.orElseSucceed(() => ""),
              Effect.map((detail) => ({ status: response.status, detail: detail.slice(0, 300) }))
            )
      ),
      Effect.catch((error) =>
        bump("unreachable").pipe(
          Effect.andThen(Effect.logDebug("fleet: router unreachable", { path, error: String(error) })),
          Effect.as(undefined)
        )
      )
    )

  const register = Effect.fn("Fleet.register")(function* (provider: FleetProvider) {
    const result = yield* post(
      "/v1/admin/providers",
      {
        provider_id: provider.providerId,
        signer: provider.signer,
        base_url: provider.baseUrl,
        dialect: provider.dialect
      },
      true
    )
    if (result === undefined) return false
    if (result.status >= 300) {
      yield* Effect.logWarning("fleet: registration refused", { provider: provider.providerId, ...result })
      return false
    }
    yield* bump("registrations")
    yield* setRegistered(provider.providerId, true)
    return true
  })

  const publishProvider = Effect.fn("Fleet.publishProvider")(function* (provider: FleetProvider) {
    if (!(yield* Ref.get(registered)).has(provider.providerId) && !(yield* register(provider))) return
    const account = simulationAccount(provider.providerId)
    yield* Effect.forEach(
      provider.config.offers,
      Effect.fnUntraced(function* (offer) {
        const quote = yield* freshQuote(provider.config, offer, account)
        const result = yield* post("/provider/quotes", quote, false)
        if (result === undefined) return
        if (result.status < 300) return yield* bump("quotesAccepted")
        yield* bump("quotesRejected")
        yield* Effect.logWarning("fleet: quote rejected", { provider: provider.providerId, ...result })
        // The router may have lost or disabled the registration; register again next cycle.
        yield* setRegistered(provider.providerId, false)
      }),
      { discard: true }
    )
  })

  /** One cycle; true when the router answered every call (whatever it answered). */
  const cycle = Effect.gen(function* () {
    const before = (yield* Ref.get(stats)).unreachable
    yield* Effect.forEach(
      providers,
      (provider) =>
        publishProvider(provider).pipe(
          Effect.catchCause((cause) =>
            Effect.logError("fleet: publish failed", { provider: provider.providerId }, cause)
          )
        ),
      { concurrency: "unbounded", discard: true }
    )
    yield* bump("cycles")
    const failedCalls = (yield* Ref.get(stats)).unreachable - before
    if (failedCalls > 0)
      yield* Effect.logWarning("fleet: router unreachable", { routerUrl: options.routerUrl, failedCalls })
    return failedCalls === 0
  }).pipe(Effect.withSpan("Fleet.publishCycle"))

  // While the router cannot be reached (e.g. still starting), try again sooner than the refresh period.
  yield* Effect.forkScoped(
    Effect.forever(
      Effect.flatMap(cycle, (healthy) =>
        Effect.sleep(Duration.millis(healthy ? refreshMs : Math.min(retryMs, refreshMs)))
      )
    )
  )
  yield* Effect.logInfo("fleet: providers listening", {
    providers: providers.map((p) => `${p.providerId}=${p.baseUrl} (${p.dialect})`)
  })

  return Fleet.of({
    providers,
    provider: (id) => providers.find((p) => p.providerId === id),
    publishNow: Effect.asVoid(cycle),
    stats: Ref.get(stats)
  })
})

/**
 * The simulated provider fleet: every provider's server, registered with the router and
 * refreshing signed standing quotes in a background fiber owned by the layer's scope.
 */
export class Fleet extends Context.Service<
  Fleet,
  {
    readonly providers: ReadonlyArray<FleetProvider>
    readonly provider: (providerId: string) => FleetProvider | undefined
    /** One register-and-quote cycle now (the background loop keeps its own pace). */
    readonly publishNow: Effect.Effect<void>
    readonly stats: Effect.Effect<FleetStats>
  }
>()("devnet/fleet/Fleet") {
  static readonly layerWithClient = (options: FleetOptions) => Layer.effect(Fleet, make(options))
  static readonly layer = (options: FleetOptions) =>
    Fleet.layerWithClient(options).pipe(Layer.provide(FetchHttpClient.layer))
}
