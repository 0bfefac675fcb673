import { createServer } from "node:http"
import { NodeHttpServer } from "@effect/platform-node"
import { ByteSize, Context, Effect, Layer, type Scope } from "effect"
import { HttpIncomingMessage, HttpRouter, HttpServer, type HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { Images } from "../inference/Images.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { OperatorAuthLive } from "./AdminAuth.ts"
import { Api } from "./Api.ts"
import { ChallengesGateLive } from "./ChallengesGate.ts"
import { DrainGate } from "./DrainGate.ts"
import { MessagesHandlers, ResponsesHandlers } from "./handlers/Adapters.ts"
import { ChatHandlers } from "./handlers/Chat.ts"
import { EvalsHandlers } from "./handlers/Evals.ts"
import { GatedHandlers } from "./handlers/Gated.ts"
import { ImagesHandlers } from "./handlers/Images.ts"
import {
  ChallengesHandlers,
  IntegrityAdminHandlers,
  IntegrityHandlers,
  ProviderClaimsHandlers
} from "./handlers/Integrity.ts"
import { KeyAnalyticsHandlers } from "./handlers/KeyAnalytics.ts"
import { CreditsHandlers, KeysHandlers, WalletsAdminHandlers } from "./handlers/Keys.ts"
import { AdminHandlers, MarketHandlers, ProviderHandlers, RoutingHandlers } from "./handlers/Market.ts"
import {
  FeedbackHandlers,
  MarketAnalyticsHandlers,
  MarketDataHandlers,
  MarketPageHandlers
} from "./handlers/MarketData.ts"
import { PointsHandlers } from "./handlers/Points.ts"
import { ReceiptHandlers } from "./handlers/Receipts.ts"
import { SessionHandlers } from "./handlers/Sessions.ts"
import { AgentSetupHandlers, AgentSetupPageHandlers } from "./handlers/Setup.ts"
import { SystemHandlers } from "./handlers/System.ts"
import { TasksHandlers } from "./handlers/Tasks.ts"
import { Cors, RouterMiddleware } from "./Middleware.ts"
import { PaidCalls } from "./PaidCall.ts"

/** All routes: the HttpApi (with `/openapi.json`), CORS and the dialect-aware middleware. */
export const ApiRoutes = HttpApiBuilder.layer(Api, { openapiPath: "/openapi.json" }).pipe(
  Layer.provide([
    SystemHandlers,
    GatedHandlers,
    AdminHandlers,
    ProviderHandlers,
    MarketHandlers,
    MarketDataHandlers,
    MarketAnalyticsHandlers,
    FeedbackHandlers,
    MarketPageHandlers,
    RoutingHandlers,
    ChatHandlers,
    ReceiptHandlers,
    SessionHandlers,
    KeyAnalyticsHandlers,
    ResponsesHandlers,
    MessagesHandlers,
    ImagesHandlers,
    WalletsAdminHandlers,
    KeysHandlers,
    CreditsHandlers,
    IntegrityHandlers,
    ChallengesHandlers,
    IntegrityAdminHandlers,
    ProviderClaimsHandlers,
    PointsHandlers,
    AgentSetupHandlers,
    AgentSetupPageHandlers,
    TasksHandlers,
    EvalsHandlers
  ]),
  Layer.provide(Layer.mergeAll(OperatorAuthLive, ChallengesGateLive, PaidCalls.layer, Images.layer)),
  Layer.provide([RouterMiddleware, DrainGate, Cors])
)

/**
 * Larger request bodies are refused (413): set once for the server's request fibers, which inherit it,
 * rather than provided into each request's context by the middleware (a copy of the context per request).
 */
const MaxBodySizeLive = Layer.effect(
  HttpIncomingMessage.MaxBodySize,
  RouterConfig.useSync((config) => ByteSize.bytes(config.maxBodyBytes))
)

/** Connections the kernel may hold for the router before it accepts them (D423). */
const ACCEPT_BACKLOG = 4096

/**
 * The router's own services (their keys are `router/…`) left out of the context the server's request
 * fibers start from (D539). Every handler took the services it uses when it was built (a lean group,
 * D537) or is given its group's context by `HttpApiBuilder` on each request; the library's services and
 * references (the scope, the clock, the tracer, the body limit, the SQL client) stay. A request fiber's
 * context is flattened once into a copy of its whole service map (the builder's merge reads its size), and
 * a held stream's request fiber keeps that copy for the stream's life: 15-odd entries instead of 80-odd.
 */
const withoutRouterServices = <R>(context: Context.Context<R>): Context.Context<R> =>
  Context.makeUnsafe(new Map([...context.mapUnsafe].filter(([key]) => !key.startsWith("router/"))))

/**
 * Serves `handler` (an app's router as one effect, `HttpRouter.toHttpEffect`) with no request logger, its
 * request fibers started from the context above.
 */
export const serveWithoutRouterServices = <E>(
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, HttpServerRequest | Scope.Scope>
) =>
  Layer.effectDiscard(
    HttpServer.HttpServer.use((server) =>
      Effect.updateContext(server.serve(handler), withoutRouterServices<Scope.Scope>)
    )
  )

export const HttpServerLive = Layer.unwrap(
  Effect.map(HttpRouter.toHttpEffect(ApiRoutes), serveWithoutRouterServices)
).pipe(
  Layer.provide(MaxBodySizeLive),
  // The HttpServer stays visible (its `address`): with `PORT=0` the kernel picks the port.
  Layer.provideMerge(
    Layer.unwrap(
      RouterConfig.useSync((config) =>
        // A burst of connections waits in the kernel's accept queue while the event loop is busy; Node's
        // default of 511 overflowed at a few thousand new streams, and the overflowed callers were reset
        // (D423). The kernel caps it at `net.core.somaxconn`.
        NodeHttpServer.layer(createServer, { port: config.port, host: config.host, backlog: ACCEPT_BACKLOG })
      )
    )
  )
)
