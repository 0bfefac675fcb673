import { Effect } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { ServiceUnavailable } from "../domain/Errors.ts"
import { Drain } from "../process/Drain.ts"
import { dialectOf, renderError } from "./Middleware.ts"

/** Seconds a refused caller is told to wait: enough for a load balancer to see `/ready` answer 503. */
export const DRAIN_RETRY_AFTER_SECONDS = 5

/** Calls that start paid work (money or provider tokens): refused while the instance drains. */
const PAID_WORK = new Set([
  "/v1/chat/completions",
  "/v1/responses",
  "/v1/messages",
  "/v1/images/generations",
  "/v1/credits/deposits",
  "/v1/credits/withdrawals"
])

export const isPaidWork = (method: string, path: string) => method === "POST" && PAID_WORK.has(path)

/**
 * While the instance drains: new paid work is `503 draining` with `Retry-After`, in the caller's dialect;
 * everything else (receipts, stream resumes and stops, quotes, `/ready`) is still served; and every
 * response closes its connection, so keep-alive clients reconnect, to another instance behind a balancer.
 * Admitted paid work is counted until its handler returns (shutdown waits for it).
 */
export const DrainGate = HttpRouter.middleware(
  Effect.gen(function* () {
    const drain = yield* Drain
    return (httpEffect) =>
      Effect.gen(function* () {
        const request = yield* HttpServerRequest.HttpServerRequest
        const path = request.url.split("?")[0] ?? "/"
        const paid = isPaidWork(request.method, path)
        if (paid && drain.isDraining()) {
          const refused = renderError(
            dialectOf(path),
            new ServiceUnavailable({
              code: "draining",
              message: "This router instance is shutting down and takes no new paid work; retry shortly"
            })
          )
          return HttpServerResponse.setHeaders(refused, {
            "retry-after": String(DRAIN_RETRY_AFTER_SECONDS),
            connection: "close"
          })
        }
        const response = yield* paid ? drain.track(httpEffect) : httpEffect
        return drain.isDraining() ? HttpServerResponse.setHeader(response, "connection", "close") : response
      })
  }),
  { global: true }
)
