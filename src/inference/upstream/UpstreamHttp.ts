import type { IncomingHttpHeaders } from "node:http"
import type { NodeHttpClient } from "@effect/platform-node"
import { type Array as Arr, Cause, Channel, Effect, Exit, Scope, Stream } from "effect"
import type { Dispatcher } from "undici"
import { UpstreamError } from "./UpstreamError.ts"

/**
 * One upstream call straight on undici's dispatcher (the pool the router keeps per origin), not
 * through Effect's `HttpClient` (D362) nor undici's `request`: a paid request makes one such call, and
 * a held-open reply keeps whatever the call is made of for as long as it streams. `request` makes a
 * handler that keeps the request's body text (the prompt), a Node `Readable` for the body with its
 * state and listeners, and an `AbortController` whose listener stays on the body; here the call is one
 * record, the dispatcher's handler, that takes the body's pieces into a buffer its reader pulls from,
 * and is aborted through undici's own controller (D500). The bounds are one timer: the head must come
 * within the budget, then the first body byte within what is left of it.
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

const dropped = () =>
  new UpstreamError({ reason: "dropped", message: "upstream body broke off before the reply ended" })

/** A body's failure as its reader sees it: the call's own (`timeout`) as it is, anything else `dropped`. */
const brokeOff = (error: unknown) => (error instanceof UpstreamError ? error : dropped())

/**
 * Why a call is let go (its reader left, or the reply was whole): made once, not per call, since
 * nobody reads it (an error per abort is a stack trace per call, D470).
 */
const LET_GO = new Error("the upstream call was let go")

/** Pieces the body may buffer ahead of its reader before undici is asked to pause it. */
const AHEAD = 64

/** The request's body as bytes of their own (`Buffer.from` of a short string takes a slice of Node's shared pool). */
const utf8 = new TextEncoder()

/** A response's head and its body, read a piece at a time. */
export interface UpstreamResponse {
  readonly status: number
  /** The response's `content-type` (empty when it sent none): the only header the router reads. */
  readonly contentType: string
  /**
   * What came since the last read, all of it, or a wait for more; `undefined` once the body ended. A
   * late first byte fails it with `timeout`, a break with `dropped`. Interrupted, the call is let go.
   */
  readonly read: Effect.Effect<ReadonlyArray<Uint8Array> | undefined, UpstreamError>
  /** Lets the call go: aborted unless its body ended. Idempotent. */
  close(): void
  /**
   * The reply was decoded whole (its terminal frame came): the body's end is usually already on its
   * way. Aborting before it would close the connection (and have undici make an abort error per call,
   * D470); so what is left is dropped until the next turn of the event loop, and only a call still open
   * then is let go.
   */
  finish(): void
}

/**
 * The dispatcher's handler of one call and, once its head is in, the response its reader pulls from.
 * Its callbacks are methods (no closure per call over what `post` was given: the body text, D461).
 */
class UpstreamCall implements Dispatcher.DispatchHandler, UpstreamResponse {
  status = 0
  contentType = ""
  readonly read: Effect.Effect<ReadonlyArray<Uint8Array> | undefined, UpstreamError>
  /** undici's controller of the call, from its start (pause, resume, abort). */
  private controller: Dispatcher.DispatchController | undefined = undefined
  /** Let go before undici started it: the start aborts it. */
  private abortedEarly = false
  /** Bounds the head and then the first body byte; cleared at the first piece, the end or a failure. */
  private timer: ReturnType<typeof setTimeout> | undefined = undefined
  /** Who waits for the head (`post`), until it comes or the call fails. */
  private onHead: ((effect: Effect.Effect<UpstreamResponse, UpstreamError>) => void) | undefined = undefined
  private pending: Array<Uint8Array> = []
  private ended = false
  private failure: unknown = undefined
  /** Whether the call was let go or finished: later pieces are dropped, nothing is told. */
  private done = false
  /** The waiting read, told of a piece, the end or a failure. */
  private wake: (() => void) | undefined = undefined

  constructor() {
    // One parameter: a register taking the abort signal would get an AbortController per wait.
    this.read = Effect.callback((resume) => {
      this.deliver(resume)
      return Effect.sync(() => this.close())
    })
  }

  start(resume: (effect: Effect.Effect<UpstreamResponse, UpstreamError>) => void, budgetMillis: number) {
    this.onHead = resume
    this.timer = setTimeout(lateFirstByte, budgetMillis, this)
  }

  private deliver(
    resume: (effect: Effect.Effect<ReadonlyArray<Uint8Array> | undefined, UpstreamError>) => void
  ) {
    this.wake = undefined
    if (this.pending.length > 0) {
      const pieces = this.pending
      this.pending = []
      if (this.controller?.paused === true) this.controller.resume()
      resume(Effect.succeed(pieces))
    } else if (this.failure !== undefined) resume(Effect.fail(brokeOff(this.failure)))
    else if (this.ended) resume(Effect.succeed(undefined))
    else if (this.done) resume(Effect.fail(dropped()))
    else this.wake = () => this.deliver(resume)
  }

  private clearTimer() {
    if (this.timer === undefined) return
    clearTimeout(this.timer)
    this.timer = undefined
  }

  /** The budget ran out: before the head the call fails with `timeout`; after it, its body does. */
  late() {
    this.timer = undefined
    const error = timeoutError()
    const onHead = this.onHead
    this.onHead = undefined
    if (onHead !== undefined) {
      this.abort(error)
      onHead(Effect.fail(error))
      return
    }
    if (this.failure === undefined && !this.ended) this.failure = error
    this.abort(error)
    this.wake?.()
  }

  private abort(reason: Error) {
    if (this.controller === undefined) this.abortedEarly = true
    else if (!this.controller.aborted) this.controller.abort(reason)
  }

  close() {
    this.clearTimer()
    this.wake = undefined
    this.onHead = undefined
    this.pending = []
    if (this.done) return
    this.done = true
    if (!this.ended && this.failure === undefined) this.abort(LET_GO)
  }

  finish() {
    if (this.ended || this.failure !== undefined || this.done) return this.close()
    this.wake = undefined
    this.pending = []
    this.done = true
    if (this.controller?.paused === true) this.controller.resume()
    setImmediate(letGoUnlessEnded, this)
  }

  /** `finish`'s next turn: still open, the call is aborted. */
  letGoUnlessEnded() {
    if (!this.ended && this.failure === undefined) this.abort(LET_GO)
  }

  onRequestStart(controller: Dispatcher.DispatchController) {
    this.controller = controller
    if (this.abortedEarly) controller.abort(LET_GO)
  }

  onResponseStart(
    controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: IncomingHttpHeaders
  ) {
    // An informational head (`100 Continue`, `103 Early Hints`) is not the response.
    if (statusCode < 200) return
    // undici's raw copy of the head stays on its controller for the call's life; the head is read here.
    controller.rawHeaders = null
    const contentType = headers["content-type"]
    this.status = statusCode
    this.contentType = typeof contentType === "string" ? contentType : ""
    const onHead = this.onHead
    this.onHead = undefined
    onHead?.(Effect.succeed(this))
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Uint8Array) {
    // The first piece is in: the rest may take as long as it takes.
    this.clearTimer()
    if (this.done) return
    this.pending.push(chunk)
    if (this.pending.length >= AHEAD) controller.pause()
    this.wake?.()
  }

  onResponseEnd() {
    this.clearTimer()
    this.ended = true
    this.wake?.()
  }

  onResponseError(_controller: Dispatcher.DispatchController | null, error: Error) {
    this.clearTimer()
    const onHead = this.onHead
    this.onHead = undefined
    if (onHead !== undefined) {
      onHead(Effect.fail(error instanceof UpstreamError ? error : connectError(error)))
      return
    }
    if (this.failure === undefined && !this.ended) this.failure = error
    this.wake?.()
  }
}

const lateFirstByte = (call: UpstreamCall) => call.late()
const letGoUnlessEnded = (call: UpstreamCall) => call.letGoUnlessEnded()

/**
 * POSTs `body` (JSON text) and answers the response head. One timer bounds the head and then the
 * first body byte: past it the call is aborted and fails with `timeoutError()` (no head yet), or its
 * body's reader does.
 */
export const post = (
  dispatcher: NodeHttpClient.Dispatcher["Service"],
  url: URL,
  headers: Record<string, string>,
  body: string,
  budgetMillis: number
): Effect.Effect<UpstreamResponse, UpstreamError> =>
  Effect.callback<UpstreamResponse, UpstreamError>((resume) => {
    const call = new UpstreamCall()
    call.start(resume, budgetMillis)
    dispatcher.dispatch(
      {
        origin: url.origin,
        path: url.pathname + url.search,
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        // Bytes of their own: undici keeps the request's body for the call's life.
        body: utf8.encode(body),
        // The budget above is the bound; undici's own would fail later with errors of its own.
        headersTimeout: 0,
        bodyTimeout: 0
      },
      call
    )
    // Interrupted while waiting: the call is let go (aborted, or a head that came meanwhile).
    return Effect.sync(() => call.close())
  })

/**
 * The body's pieces as they arrive; a late first byte fails with `timeout`, a break with `dropped`. A
 * reader that stops reading (the terminal frame came) lets the call end as `finish` does; any other exit
 * lets it go at once.
 */
export const bodyStream = (response: UpstreamResponse): Stream.Stream<Uint8Array, UpstreamError> => {
  const pull: Effect.Effect<
    Arr.NonEmptyReadonlyArray<Uint8Array>,
    UpstreamError | Cause.Done
  > = Effect.flatMap(response.read, (pieces) =>
    pieces === undefined ? Cause.done() : Effect.succeed(pieces as Arr.NonEmptyReadonlyArray<Uint8Array>)
  )
  return Stream.fromChannel(
    Channel.fromTransform((_, scope) =>
      Effect.as(
        Scope.addFinalizerExit(scope, (exit) =>
          Effect.sync(() => (Exit.isSuccess(exit) ? response.finish() : response.close()))
        ),
        pull
      )
    )
  )
}

/**
 * At most the first 4 KB of an error body, as text, within 2 s (a provider streaming garbage cannot
 * hold the call open); then the call is let go.
 */
export const errorBodyText = (response: UpstreamResponse): Effect.Effect<string> => {
  const pieces: Array<Uint8Array> = []
  let length = 0
  const text = () => Buffer.concat(pieces).toString("utf8")
  const more: Effect.Effect<string> = Effect.flatMap(
    Effect.orElseSucceed(response.read, () => undefined),
    (read) => {
      if (read === undefined) return Effect.sync(text)
      for (const piece of read) {
        pieces.push(piece)
        length += piece.length
      }
      return length >= 4096 ? Effect.sync(text) : more
    }
  )
  return more.pipe(
    Effect.timeoutOrElse({ duration: 2000, orElse: () => Effect.sync(text) }),
    Effect.ensuring(Effect.sync(() => response.close()))
  )
}
