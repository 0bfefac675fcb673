import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Option, Schema } from "effect"
import { HttpRouter, HttpServer, HttpServerResponse } from "effect/http"
import { HttpApi, HttpApiBuilder, HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { leanGroup } from "../../src/http/handlers/LeanGroup.ts"

/** A service only the group's layer is given (as the app's services are given to the real groups). */
class GroupOnly extends Context.Service<GroupOnly, { readonly name: string }>()("test/GroupOnly") {}

const Seen = Schema.Struct({
  captured: Schema.String,
  groupOnlyPerRequest: Schema.Boolean,
  sameMemoMap: Schema.Boolean
})

const Probe = HttpApi.make("probe")
  .add(HttpApiGroup.make("lean").add(HttpApiEndpoint.get("lean", "/lean", { success: Seen })))
  .add(HttpApiGroup.make("plain").add(HttpApiEndpoint.get("plain", "/plain", { success: Seen })))

/** The memo map a request of a plain router route (no group, nothing provided per request) runs with. */
let serverMemoMap: unknown
const raw = HttpRouter.add(
  "GET",
  "/raw",
  Effect.map(Effect.context<never>(), (context) => {
    serverMemoMap = Context.getOrUndefined(context, Layer.CurrentMemoMap)
    return HttpServerResponse.text("ok")
  })
)

/** What a handler sees per request: whether `GroupOnly` is in reach, and whether its memo map is the server's. */
const seen = (captured: string) =>
  Effect.map(Effect.context<never>(), (context) => ({
    captured,
    groupOnlyPerRequest: Option.isSome(Context.getOption(context, GroupOnly)),
    sameMemoMap: Context.getOrUndefined(context, Layer.CurrentMemoMap) === serverMemoMap
  }))

const LeanLive = leanGroup(
  Effect.gen(function* () {
    const { name } = yield* GroupOnly
    return HttpApiBuilder.group(Probe, "lean", (handlers) => handlers.handle("lean", () => seen(name)))
  })
)
const PlainLive = HttpApiBuilder.group(
  Probe,
  "plain",
  Effect.fn(function* (handlers) {
    const { name } = yield* GroupOnly
    return handlers.handle("plain", () => seen(name))
  })
)

const app = Layer.mergeAll(
  HttpApiBuilder.layer(Probe).pipe(
    Layer.provide([LeanLive, PlainLive]),
    Layer.provide(Layer.succeed(GroupOnly, { name: "built" })),
    Layer.provide(HttpServer.layerServices)
  ),
  raw
)

describe("leanGroup (D537)", () => {
  it.effect(
    "a lean group's handlers run in the server's own context: nothing of the group's is provided per request",
    () =>
      Effect.gen(function* () {
        const { handler, dispose } = HttpRouter.toWebHandler(app, { disableLogger: true })
        const get = (path: string) =>
          Effect.promise(() =>
            handler(new Request(`http://probe${path}`)).then((r) => r.json() as Promise<unknown>)
          )
        yield* Effect.promise(() => handler(new Request("http://probe/raw")))
        // A plain group provides its build-time context to every request: a copy of the whole service map.
        expect(yield* get("/plain")).toEqual({
          captured: "built",
          groupOnlyPerRequest: true,
          sameMemoMap: true
        })
        // A lean group took what it uses when it was built and provides nothing per request (not even the
        // memo map `Layer.build` would have added, which alone costs the copy).
        expect(yield* get("/lean")).toEqual({
          captured: "built",
          groupOnlyPerRequest: false,
          sameMemoMap: true
        })
        yield* Effect.promise(() => dispose())
      })
  )
})
