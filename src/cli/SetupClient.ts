import { Context, Effect, Layer } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import { HttpApi, HttpApiClient } from "effect/http-api"
import {
  DEVICE_CODE_GRANT,
  type DeviceFlowError,
  type SetupStarted,
  type StartSetupRequest,
  type TokenIssued
} from "../domain/Setup.ts"
import { AgentSetupApi } from "../http/SetupApi.ts"
import { SetupFailed, Unreachable } from "./Polling.ts"

/** The setup group alone: the CLI's client is derived from the router's own endpoint definitions. */
const SetupOnlyApi = HttpApi.make("svc-setup").add(AgentSetupApi)

export type Started = typeof SetupStarted.Type
export type Token = typeof TokenIssued.Type

/** The router's agent-setup endpoints as the CLI calls them. */
export class SetupClient extends Context.Service<
  SetupClient,
  {
    readonly start: (request: typeof StartSetupRequest.Type) => Effect.Effect<Started, SetupFailed>
    readonly exchange: (deviceCode: string) => Effect.Effect<Token, DeviceFlowError | Unreachable>
  }
>()("router/cli/SetupClient") {
  static readonly layer = (routerUrl: string) =>
    Layer.effect(
      SetupClient,
      Effect.gen(function* () {
        const client = yield* HttpApiClient.group(SetupOnlyApi, {
          group: "agentSetup",
          httpClient: yield* HttpClient.HttpClient,
          baseUrl: routerUrl
        })
        const unreachable = (cause: { readonly message: string }) =>
          new Unreachable({ message: `Cannot reach the router at ${routerUrl}: ${cause.message}` })

        const start = (request: typeof StartSetupRequest.Type) =>
          client.startSetup({ payload: request }).pipe(
            Effect.catchTags({
              InvalidRequest: (error) => Effect.fail(new SetupFailed({ message: error.message })),
              HttpClientError: (error) =>
                Effect.fail(new SetupFailed({ message: unreachable(error).message })),
              SchemaError: (error) =>
                Effect.fail(
                  new SetupFailed({ message: `Unexpected answer from ${routerUrl}: ${error.message}` })
                )
            })
          )

        const exchange = (deviceCode: string) =>
          client.exchangeToken({ payload: { grant_type: DEVICE_CODE_GRANT, device_code: deviceCode } }).pipe(
            Effect.map((issued) => issued.body),
            // An answer the client cannot read (a proxy's error page) is retried like a lost connection.
            Effect.catchTags({
              HttpClientError: (error) => Effect.fail(unreachable(error)),
              SchemaError: (error) => Effect.fail(unreachable(error))
            })
          )

        return SetupClient.of({ start, exchange })
      })
    ).pipe(Layer.provide(FetchHttpClient.layer))
}
