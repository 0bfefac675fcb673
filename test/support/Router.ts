import { Context, Effect, Layer, Redacted } from "effect"
import { HttpServer } from "effect/http"
import { Chain, type ChainShape } from "../../src/chain/Chain.ts"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import type { ProviderConfig } from "../../src/devnet/fleet/FleetConfig.ts"
import { HttpServerLive } from "../../src/http/Server.ts"
import { ServicesLive } from "../../src/Router.ts"
import { RouterConfig, type RouterSettings } from "../../src/RouterConfig.ts"
import { TestDatabase } from "./Database.ts"

export const OPERATOR_TOKEN = "test-operator-token"

/** Where the router under test listens. */
export class RouterUrl extends Context.Service<RouterUrl, string>()("test/RouterUrl") {}

/**
 * The real router, in process: its own migrated database, its own Anvil with the project's
 * contracts, the HTTP server on a free loopback port.
 */
export const routerLayer = (
  overrides: Partial<RouterSettings> = {},
  /** The chain as the router sees it: the real one, with what a test puts between them (a held answer). */
  chainSeen?: (chain: ChainShape) => ChainShape
) =>
  Layer.unwrap(
    Effect.gen(function* () {
      // Port 0: the kernel picks a free port at bind time (no race between test files).
      const config = RouterConfig.layerTest({ port: 0, ...overrides })
      const chain =
        chainSeen === undefined
          ? Chain.layer
          : Layer.effect(Chain, Effect.map(Chain, chainSeen)).pipe(Layer.provide(Chain.layer))
      const infrastructure = Layer.mergeAll(TestDatabase, chain).pipe(Layer.provideMerge(config))
      const url = Layer.effect(
        RouterUrl,
        Effect.map(Effect.service(HttpServer.HttpServer), (server) => {
          const address = server.address
          return "port" in address ? `http://127.0.0.1:${address.port}` : "http://127.0.0.1"
        })
      )
      return url.pipe(
        Layer.provideMerge(HttpServerLive),
        Layer.provideMerge(ServicesLive),
        Layer.provideMerge(infrastructure)
      )
    })
  )

/** The router plus the simulated fleet (the default one unless `providers` is given) registered and quoting into it. */
export const routerWithFleet = (
  overrides: Partial<RouterSettings> = {},
  providers?: ReadonlyArray<ProviderConfig>,
  chainSeen?: (chain: ChainShape) => ChainShape
) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const router = routerLayer(overrides, chainSeen)
      const fleet = Layer.unwrap(
        Effect.map(RouterUrl, (url) =>
          Fleet.layer({
            routerUrl: url,
            operatorToken: Redacted.make(OPERATOR_TOKEN),
            refreshMs: 2_000,
            providers
          })
        )
      )
      return fleet.pipe(Layer.provideMerge(router))
    })
  )

export interface Reply {
  readonly status: number
  readonly headers: Headers
  readonly text: string
  readonly json: unknown
}

/** A plain HTTP call against the router (tests talk to it as any client would). */
export const call = (path: string, init: RequestInit = {}) =>
  Effect.gen(function* () {
    const base = yield* RouterUrl
    return yield* Effect.promise(async (): Promise<Reply> => {
      const response = await fetch(`${base}${path}`, init)
      const text = await response.text()
      let json: unknown
      try {
        json = JSON.parse(text)
      } catch {
        json = undefined
      }
      return { status: response.status, headers: response.headers, text, json }
    })
  })

export const postJson = (path: string, body: unknown, headers: Record<string, string> = {}) =>
  call(path, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body)
  })
