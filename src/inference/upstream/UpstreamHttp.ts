import type { IncomingHttpHeaders } from "node:http"
import type { Readable } from "node:stream"
import { type NodeHttpClient, NodeStream } from "@effect/platform-node"
import { Effect, type Stream } from "effect"
import { UpstreamError } from "./UpstreamError.ts"

/**
 * One upstream call straight on undici's request API (the pool the router keeps per origin), not
 * through Effect's `HttpClient`: a paid request makes one such call, and the client's layers (a copy
 * of the fiber's service map, an abort controller and a finalization-registry entry per request, a
 * headers object per read of `headers`) and a `timeout` that forks two fibers for each of its two
 * bounds were CPU on every call (D362). The bounds are one timer: the head must come within the
 * budget, then the first body byte within what is left of it.
 */

export const timeoutError = () =>
  new UpstreamError({ reason: "timeout", message: "upstream sent no first byte within the timeout" })

/** The system error code (`ECONNREFUSED`, ...) somewhere down a failure's cause chain. */
const errorCode = (error: unknown, depth = 0): string | undefined => {
  if (typeof error !== "object" || error === null || depth > 4) return undefined
  if ("code" in error && typeof error.code === "string") return error.code
  return "cause" in error ? errorCode(error.cause, depth + 1) : undefined
}

const connectError = (error: unknown) => {
  const code = errorCode(error)
  return new UpstreamError({
    reason: "connect",
    message: `could not reach upstream (TransportError${code === undefined ? "" : `: ${code}`})`
  })
}

const ignore = () => {}

/**
 * Lets undici's body go. A body torn down before its end emits its abort as an `error` event after
 * `destroy` returns; with no listener left that event is an uncaught exception, which ends the process.
 * So a listener that ignores it stays on for good.
 */
export const letGo = (body: Readable) => {
  body.on("error", ignore)
  if (!body.destroyed) body.destroy()
}

export interface UpstreamResponse {
  readonly status: number
  readonly headers: IncomingHttpHeaders
  /** undici's body; destroyed with `timeoutError()` if its first byte is late. */
  readonly body: Readable
}

/**
 * Clears the first-byte timer at the body's first piece (or its close). Made here, not in `post`: a
 * listener made there would keep `post`'s whole closure context, the request's JSON body (the prompt)
 * among it, for as long as the reply streams (D461).
 */
const clearAtFirstByte = (body: Readable, late: ReturnType<typeof setTimeout>) => {
  // The timer (whose callback is made in `post`) is let go once cleared, and so is the other listener.
  let timer: ReturnType<typeof setTimeout> | undefined = late
  const clear = () => {
    if (timer !== undefined) clearTimeout(timer)
    timer = undefined
    body.off("readable", clear)
    body.off("close", clear)
  }
  body.once("readable", clear)
  body.once("close", clear)
}

/**
 * POSTs `body` (JSON text) and answers the response head. One timer bounds the head and then the
 * first body byte: past it the request is aborted (no head yet) or the body destroyed with
 * `timeoutError()`, which its reader sees as that error.
 */
export const post = (
  dispatcher: NodeHttpClient.Dispatcher["Service"],
  url: URL,
  headers: Record<string, string>,
  body: string,
  budgetMillis: number
): Effect.Effect<UpstreamResponse, UpstreamError> =>
  Effect.callback<UpstreamResponse, UpstreamError>((resume) => {
    const controller = new AbortController()
    let response: UpstreamResponse | undefined
    const late = setTimeout(() => {
      if (response === undefined) controller.abort(timeoutError())
      else response.body.destroy(timeoutError())
    }, budgetMillis)
    dispatcher
      .request({
        origin: url.origin,
        path: url.pathname + url.search,
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body,
        signal: controller.signal,
        // The budget above is the bound; undici's own would fail later with errors of its own.
        headersTimeout: 0,
        bodyTimeout: 0
      })
      .then(
        (data) => {
          const readable = data.body as unknown as Readable
          response = { status: data.statusCode, headers: data.headers, body: readable }
          // The first piece of the body (or its end) is in: the rest may take as long as it takes.
          clearAtFirstByte(readable, late)
          resume(Effect.succeed(response))
        },
        (error: unknown) => {
          clearTimeout(late)
          resume(Effect.fail(error instanceof UpstreamError ? error : connectError(error)))
        }
      )
    // Interrupted while waiting: the request is aborted, or a head that came meanwhile let go.
    return Effect.sync(() => {
      clearTimeout(late)
      if (response === undefined) controller.abort()
      else letGo(response.body)
    })
  })

const dropped = () =>
  new UpstreamError({ reason: "dropped", message: "upstream body broke off before the reply ended" })

/** The body's pieces as they arrive; a late first byte fails with `timeout`, a break with `dropped`. */
export const bodyStream = (response: UpstreamResponse): Stream.Stream<Uint8Array, UpstreamError> =>
  NodeStream.fromReadable({
    evaluate: () => response.body,
    onError: (error) => (error instanceof UpstreamError ? error : dropped())
  })

/**
 * At most the first 4 KB of an error body, as text, within 2 s (a provider streaming garbage cannot
 * hold the call open); then the body is let go.
 */
export const errorBodyText = (response: UpstreamResponse): Effect.Effect<string> =>
  Effect.callback<string>((resume) => {
    const body = response.body
    const pieces: Array<Buffer> = []
    let length = 0
    let finished = false
    const done = () => {
      if (finished) return
      finished = true
      clearTimeout(timer)
      body.off("data", onData)
      body.off("end", done)
      body.off("error", done)
      body.off("close", done)
      letGo(body)
      resume(Effect.succeed(Buffer.concat(pieces).toString("utf8")))
    }
    const onData = (piece: Buffer) => {
      pieces.push(piece)
      length += piece.length
      if (length >= 4096) done()
    }
    const timer = setTimeout(done, 2000)
    body.on("data", onData)
    body.once("end", done)
    body.once("error", done)
    body.once("close", done)
    return Effect.sync(() => {
      clearTimeout(timer)
      letGo(body)
    })
  })
