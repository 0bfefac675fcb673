import { createServer } from "node:http"
import { NodeHttpServer } from "@effect/platform-node"
import { describe, expect, it } from "@effect/vitest"
import { ByteSize, Context, Effect, Layer, Option } from "effect"
import { HttpIncomingMessage, HttpRouter, HttpServer, HttpServerResponse } from "effect/http"
import { serveWithoutRouterServices } from "../../src/http/Server.ts"

/** One of the router's own services (its key is `router/…`), given to the server's layer as the app's are. */
class Probe extends Context.Service<Probe, { readonly name: string }>()("router/test/Probe") {}

/** What a request sees: the router's service (it must not), the library's body limit (it must). */
const route = HttpRouter.add(
  "GET",
  "/seen",
  Effect.map(Effect.context<never>(), (context) =>
    HttpServerResponse.jsonUnsafe({
      probe: Option.isSome(Context.getOption(context, Probe)),
      maxBody: Option.map(Context.getOption(context, HttpIncomingMessage.MaxBodySize), Number).pipe(
        Option.getOrNull
      )
    })
  )
)

/** A route built with the router's service in reach: it takes it when built, as every handler does. */
const built = Layer.effectDiscard(
  Effect.gen(function* () {
    const { name } = yield* Probe
    const router = yield* HttpRouter.HttpRouter
    yield* router.add("GET", "/built", Effect.succeed(HttpServerResponse.text(name)))
  })
)

const server = Layer.unwrap(
  Effect.map(HttpRouter.toHttpEffect(Layer.mergeAll(route, built)), serveWithoutRouterServices)
).pipe(
  Layer.provide(Layer.succeed(Probe, { name: "built" })),
  Layer.provide(Layer.succeed(HttpIncomingMessage.MaxBodySize, ByteSize.bytes(1234))),
  Layer.provideMerge(NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" }))
)

describe("the server's request fibers (D539)", () => {
  it.effect(
    "start without the router's own services, with the library's, and handlers keep what they took when built",
    () =>
      Effect.gen(function* () {
        const { address } = yield* HttpServer.HttpServer
        const base = "port" in address ? `http://127.0.0.1:${address.port}` : ""
        const seen = yield* Effect.promise(() => fetch(`${base}/seen`).then((r) => r.json()))
        expect(seen).toEqual({ probe: false, maxBody: 1234 })
        const name = yield* Effect.promise(() => fetch(`${base}/built`).then((r) => r.text()))
        expect(name).toBe("built")
      }).pipe(Effect.provide(server), Effect.scoped)
  )
})
