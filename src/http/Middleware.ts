import { Cause, Clock, Effect, Exit, type Schema, SchemaIssue } from "effect"
import { HttpRouter, HttpServerError, HttpServerRequest, HttpServerResponse } from "effect/http"
import { HttpApi, HttpApiError } from "effect/http-api"
import { databaseUnavailable, isSqlError } from "../db/SqlFaults.ts"
import {
  type DialectError,
  InvalidRequest,
  NotFound,
  PayloadTooLarge,
  ServiceUnavailable,
  UnsupportedMediaType
} from "../domain/Errors.ts"
import { Api } from "./Api.ts"
import { anthropicBody, type Dialect, openAiBody } from "./ErrorWire.ts"
import { recordRequest } from "./Metrics.ts"
import { AUCTION_VERSION } from "./SystemApi.ts"

/** The messages adapter answers in Anthropic's convention; everything else in OpenAI's. */
export const dialectOf = (path: string): Dialect => (path.startsWith("/v1/messages") ? "anthropic" : "openai")

export const renderError = (dialect: Dialect, error: DialectError) => {
  const status = (error.constructor as { ast?: { annotations?: { httpApiStatus?: number } } }).ast
    ?.annotations?.httpApiStatus
  const encoded = {
    _tag: error._tag,
    message: error.message,
    code: error.code,
    ...(error.param ? { param: error.param } : {})
  }
  return HttpServerResponse.jsonUnsafe(
    dialect === "anthropic" ? anthropicBody(encoded) : openAiBody(encoded),
    {
      status: status ?? 500
    }
  )
}

const schemaMessage = (error: Schema.SchemaError) => SchemaIssue.makeFormatterDefault()(error.issue)

/**
 * Seconds a `503` tells its caller to wait when nothing more specific was said (a draining instance
 * and a full live-events endpoint set their own): a database fault or a busy market passes within
 * seconds, and a sooner retry only adds to the load that caused it (D210).
 */
export const RETRY_AFTER_SECONDS = 2

/** Turns framework-level failures (bad JSON, schema mismatch, unknown route, oversize) into typed errors. */
const frameworkError = (cause: Cause.Cause<unknown>, path: string): DialectError | undefined => {
  for (const reason of cause.reasons) {
    const value = Cause.isFailReason(reason)
      ? reason.error
      : Cause.isDieReason(reason)
        ? reason.defect
        : undefined
    if (HttpApiError.HttpApiSchemaError.is(value)) {
      return new InvalidRequest({
        code: "invalid_request",
        message: `Invalid request ${value.kind.toLowerCase()}: ${schemaMessage(value.cause)}`
      })
    }
    // The database failing under a request is a 503 to retry, never a 500 (nor a refusal to pay).
    if (isSqlError(value)) return databaseUnavailable(value)
    if (value instanceof ServiceUnavailable) return value
    if (HttpApiError.HttpApiPayloadTooLarge.is(value)) {
      return new PayloadTooLarge({ code: "payload_too_large", message: value.message })
    }
    if (value instanceof HttpServerError.HttpServerError) {
      if (value.reason._tag === "RouteNotFound") {
        return new NotFound({ code: "not_found", message: `No route for ${path}` })
      }
      if (value.reason._tag === "RequestParseError") {
        const text = String(value.reason.cause ?? "")
        return /too large|size|maxBytes/i.test(text)
          ? new PayloadTooLarge({ code: "payload_too_large", message: "Request body is too large" })
          : new InvalidRequest({ code: "invalid_json", message: "Request body is not valid JSON" })
      }
    }
  }
  return undefined
}

/** Route patterns of the API, so metrics carry `/v1/receipts/:id`, never a raw id. */
const routePatterns: Array<{ readonly pattern: string; readonly regex: RegExp }> = []
HttpApi.reflect(Api, {
  onGroup: () => {},
  onEndpoint: ({ endpoint }) => {
    const regex = new RegExp(`^${endpoint.path.replace(/:[A-Za-z_]+/g, "[^/]+")}$`)
    routePatterns.push({ pattern: endpoint.path, regex })
  }
})
export const registerRoutePattern = (pattern: string) =>
  routePatterns.push({ pattern, regex: new RegExp(`^${pattern.replace(/:[A-Za-z_]+/g, "[^/]+")}$`) })
/** A path's pattern, remembered: a paid call's path is the same on every request (bounded, D322). */
const routeByPath = new Map<string, string>()
const routeOf = (path: string) => {
  const known = routeByPath.get(path)
  if (known !== undefined) return known
  const route = routePatterns.find((r) => r.regex.test(path))?.pattern ?? "unmatched"
  if (routeByPath.size >= 1000) routeByPath.clear()
  routeByPath.set(path, route)
  return route
}

/**
 * Global middleware: every response carries the auction version; every failure that
 * escaped a handler's typed error channel is rendered in the caller's dialect; every `503`
 * carries `Retry-After`; every request is counted and timed by route pattern.
 */
export const RouterMiddleware = HttpRouter.middleware(
  Effect.succeed((httpEffect) =>
    Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      const path = request.url.split("?")[0] ?? "/"
      const started = yield* Clock.currentTimeMillis
      const exit = yield* Effect.exit(httpEffect)
      let response: HttpServerResponse.HttpServerResponse
      if (Exit.isSuccess(exit)) {
        // The API framework answers a body it has no decoder for with a plain-text 415; the caller
        // gets it as a JSON error in its own dialect like every other refusal.
        response =
          exit.value.status === 415 && exit.value.headers["content-type"]?.startsWith("text/plain") === true
            ? renderError(
                dialectOf(path),
                new UnsupportedMediaType({
                  code: "unsupported_media_type",
                  param: "content-type",
                  message: `Send the body as application/json (got ${(request.headers["content-type"] ?? "none").slice(0, 80)})`
                })
              )
            : exit.value
      } else {
        const known = frameworkError(exit.cause, path)
        if (known !== undefined) {
          response = renderError(dialectOf(path), known)
        } else if (Cause.hasInterruptsOnly(exit.cause)) {
          return yield* Effect.failCause(exit.cause)
        } else {
          yield* Effect.logError("unhandled request failure", Cause.pretty(exit.cause))
          response = renderError(
            dialectOf(path),
            new ServiceUnavailable({
              code: "internal_error",
              message: "The router failed to handle this request"
            })
          )
          response = HttpServerResponse.setStatus(response, 500)
        }
      }
      if (response.status === 503 && response.headers["retry-after"] === undefined) {
        response = HttpServerResponse.setHeader(response, "retry-after", String(RETRY_AFTER_SECONDS))
      }
      const finished = yield* Clock.currentTimeMillis
      yield* recordRequest(
        { route: routeOf(path), method: request.method, status: String(response.status) },
        (finished - started) / 1000
      )
      return response.headers["x-svc-auction-version"] === undefined
        ? HttpServerResponse.setHeader(response, "x-svc-auction-version", AUCTION_VERSION)
        : response
    })
  ),
  { global: true }
)

export const Cors = HttpRouter.cors({
  allowedOrigins: ["*"],
  allowedHeaders: [
    "content-type",
    "authorization",
    "payment-signature",
    "x-payment",
    "x-credit-key",
    "x-api-key",
    "idempotency-key",
    "x-session-token",
    "x-stream-token",
    "x-task-token",
    "x-routing-agent-role",
    "x-routing-parent-task",
    "x-routing-agent-id"
  ],
  exposedHeaders: [
    "PAYMENT-REQUIRED",
    "PAYMENT-RESPONSE",
    "x-request-id",
    "x-routing-model",
    "x-clear-price-in",
    "x-clear-price-out",
    "x-svc-auction-version",
    "x-svc-quotes-competing",
    "x-svc-price-setter",
    "x-svc-service-premium-cap-bps",
    "x-key-budget-remaining",
    "x-session-token",
    "x-stream-token"
  ]
})
