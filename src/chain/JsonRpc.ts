import { Pool } from "@effect/platform-node/Undici"
import { Effect } from "effect"
import type { Dispatcher } from "undici"

/**
 * Light JSON-RPC to the chain's node: every call asked for in one turn of the event loop goes out in one
 * JSON-RPC batch (one HTTP POST straight on an undici pool), and each call gets its own answer or its own
 * error. No viem request pipeline (buildRequest, withRetry, withDedupe, withTimeout: an Error built per
 * request), no `fetch`. The paid path's reads (`QuickReads.ts`, D325) and the settlement's transactions
 * (`Outgoing.ts`, D485) are built on it. Imports neither viem nor the chain's errors: callers classify.
 */

/** One HTTP POST of a JSON body: the status and the body of the answer. */
export type PostJson = (body: string) => Promise<{ readonly status: number; readonly body: string }>

/** The request's body as bytes of their own (`Buffer.from` of a short string takes a slice of Node's shared pool). */
const utf8 = new TextEncoder()

/**
 * The dispatcher's handler of one POST: the answer's pieces gathered, then the status and the text, or
 * the failure; one timer bounds the whole exchange. Its callbacks are methods (no closure per request).
 */
class PostCall implements Dispatcher.DispatchHandler {
  private status = 0
  private readonly pieces: Array<Uint8Array> = []
  private controller: Dispatcher.DispatchController | undefined = undefined
  private timedOut: Error | undefined = undefined
  private readonly timer: ReturnType<typeof setTimeout>
  private settled = false
  private readonly resolve: (answer: { readonly status: number; readonly body: string }) => void
  private readonly reject: (error: Error) => void

  constructor(
    resolve: (answer: { readonly status: number; readonly body: string }) => void,
    reject: (error: Error) => void,
    timeoutMs: number
  ) {
    this.resolve = resolve
    this.reject = reject
    this.timer = setTimeout(lateAnswer, timeoutMs, this)
  }

  /** The time ran out: the request is aborted and fails with a `TimeoutError`. */
  late() {
    const timedOut = new Error("the node did not answer in time")
    timedOut.name = "TimeoutError"
    this.timedOut = timedOut
    if (this.controller !== undefined && !this.controller.aborted) this.controller.abort(timedOut)
    this.fail(timedOut)
  }

  private fail(error: Error) {
    if (this.settled) return
    this.settled = true
    clearTimeout(this.timer)
    this.reject(error)
  }

  /**
   * A request whose time ran out while it waited in the pool for a connection is aborted as it gets one
   * (undici then closes that connection, where Node's client took a queued request out of its queue):
   * only when more than the pool's 8 requests wait on a stalled node, and never sent late.
   */
  onRequestStart(controller: Dispatcher.DispatchController) {
    this.controller = controller
    if (this.timedOut !== undefined) controller.abort(this.timedOut)
  }

  /** The status is all of the head the batch reads; an informational one (`103 Early Hints`) is not the answer. */
  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number) {
    if (statusCode >= 200) {
      controller.rawHeaders = null
      this.status = statusCode
    }
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Uint8Array) {
    this.pieces.push(chunk)
  }

  onResponseEnd() {
    if (this.settled) return
    this.settled = true
    clearTimeout(this.timer)
    const body = this.pieces.length === 1 ? this.pieces[0]! : Buffer.concat(this.pieces)
    this.resolve({
      status: this.status,
      body: Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString("utf8")
    })
  }

  onResponseError(_controller: Dispatcher.DispatchController | null, error: Error) {
    this.fail(this.timedOut ?? error)
  }
}

const lateAnswer = (call: PostCall) => call.late()

/**
 * POSTs straight on an undici pool of kept-alive connections (a few), one handler per request: cheaper per
 * request than Node's own HTTP client (a `ClientRequest`, an `IncomingMessage` and their listeners: about
 * 40 µs of CPU more a request, `npm run bench:json-rpc`, D578) and than the global `fetch` (WHATWG
 * streams, a Response and its body reader). Credentials in the URL go as basic authorization, as Node's
 * client sends them.
 */
export const httpPost = (rpcUrl: string, timeoutMs: number): PostJson => {
  const url = new URL(rpcUrl)
  // HTTP/1.1 as Node's client spoke it: undici would offer HTTP/2 to a TLS endpoint (one multiplexed connection).
  const pool = new Pool(url.origin, { connections: 8, allowH2: false })
  const path = url.pathname + url.search
  const headers: Record<string, string> = { "content-type": "application/json" }
  if (url.username !== "" || url.password !== "") {
    const credentials = `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`
    headers.authorization = `Basic ${Buffer.from(credentials).toString("base64")}`
  }
  return (body) =>
    new Promise((resolve, reject) => {
      pool.dispatch(
        // The handler's timer is the bound; undici's own would fail later with errors of its own.
        { path, method: "POST", headers, body: utf8.encode(body), headersTimeout: 0, bodyTimeout: 0 },
        new PostCall(resolve, reject, timeoutMs)
      )
    })
}

/** Why a call got no result: the node answered it with an error, or the batch got no usable answer. */
export type RpcFailure =
  | {
      readonly _tag: "Answered"
      readonly code: number | undefined
      /** The node's message, at most 200 characters (a node's message carries no URL). */
      readonly message: string
      readonly data: unknown
    }
  | {
      readonly _tag: "Unanswered"
      readonly timedOut: boolean
      /** Never the URL nor the transport's own message (which may name the host): a fixed text. */
      readonly message: string
    }

/** What a caller makes of a call's result or failure (one step: no Effect chained after the answer). */
export interface Settle<A, E> {
  readonly result: (result: unknown) => Effect.Effect<A, E>
  readonly failure: (failure: RpcFailure) => E
}

export interface CallOptions {
  /** false: sent once whatever happens (a call not safe or not worth repeating); else the batch's `retries`. */
  readonly retry?: boolean
}

export interface JsonRpcBatch {
  /** One JSON-RPC call, sent with the rest of the turn's calls: its result, or why there is none. */
  readonly call: (
    method: string,
    params: ReadonlyArray<unknown>,
    options?: CallOptions
  ) => Effect.Effect<unknown, RpcFailure>
  /** `call`, its answer read by `settle` as it arrives. */
  readonly callWith: <A, E>(
    method: string,
    params: ReadonlyArray<unknown>,
    settle: Settle<A, E>,
    options?: CallOptions
  ) => Effect.Effect<A, E>
  /** Sends the calls asked for so far in this turn now instead of at its end (`QuickReads.send`, D382). */
  readonly send: () => void
}

export interface JsonRpcBatchOptions {
  /** Most calls one HTTP request carries (providers cap batches; a bigger turn sends several). */
  readonly limit?: number
  /**
   * How many more times a call is sent when it got no answer (unreachable, timed out, HTTP 403/408/413/
   * 429/5xx, its id missing from the batch's answer) or a transient error answer (`TRANSIENT_CODES`,
   * viem's set: internal error, limit exceeded, rate limited); any other error answer from the node is
   * final. 0 (quick reads): once.
   */
  readonly retries?: number
  /** Wait before the n-th resend (1-based): viem's default, 150 ms doubling. */
  readonly retryDelayMs?: (attempt: number) => number
}

/** The HTTP statuses viem's transport retries: the node or a proxy in front of it is busy or failing. */
const TRANSIENT_STATUS = new Set([403, 408, 413, 429, 500, 502, 503, 504])

interface Queued {
  readonly method: string
  readonly params: ReadonlyArray<unknown>
  /** Sends left after this one. */
  readonly retriesLeft: number
  readonly attempt: number
  readonly settle: Settle<unknown, unknown>
  readonly resume: (answer: Effect.Effect<unknown, unknown>) => void
}

interface RpcAnswer {
  readonly id?: unknown
  readonly result?: unknown
  readonly error?: { readonly code?: unknown; readonly message?: unknown; readonly data?: unknown }
}

const unanswered = (timedOut: boolean, message: string): RpcFailure => ({
  _tag: "Unanswered",
  timedOut,
  message
})

/**
 * The error codes viem's transport retries (`shouldRetry` in viem's `utils/buildRequest.ts`): unknown (-1),
 * limit exceeded (-32005), internal error (-32603), and the providers' rate limits answered inside a batch
 * element (Alchemy's 429, QuickNode's -32007). The node did not refuse the call itself: asked again later,
 * it may answer it.
 */
export const TRANSIENT_CODES: ReadonlySet<number> = new Set([-1, -32005, -32603, 429, -32007])

/** The node's error answer as the caller reads it (`Answered`). */
const answered = (error: NonNullable<RpcAnswer["error"]>): RpcFailure & { readonly _tag: "Answered" } => ({
  _tag: "Answered",
  code: typeof error.code === "number" ? error.code : undefined,
  message: typeof error.message === "string" ? error.message.slice(0, 200) : "error",
  data: error.data
})

/**
 * What one answer (undefined: none for the call) makes of a call: read by its caller (`settle`: its result
 * or the node's error), or a failure that is `transient` (the node answered one of `TRANSIENT_CODES`, or
 * nothing): the call is sent again if it has sends left.
 */
const outcome = (
  answer: RpcAnswer | undefined
):
  | { readonly _tag: "Result"; readonly result: unknown }
  | { readonly _tag: "Failure"; readonly failure: RpcFailure; readonly transient: boolean } => {
  if (answer === undefined)
    return { _tag: "Failure", failure: unanswered(false, "no answer in the batch"), transient: true }
  const error = answer.error
  if (error !== undefined && error !== null) {
    const failure = answered(error)
    return {
      _tag: "Failure",
      failure,
      transient: failure.code !== undefined && TRANSIENT_CODES.has(failure.code)
    }
  }
  return { _tag: "Result", result: answer.result }
}

const isErrorAnswer = (body: unknown): body is RpcAnswer =>
  typeof body === "object" &&
  body !== null &&
  !Array.isArray(body) &&
  typeof (body as RpcAnswer).error === "object" &&
  (body as RpcAnswer).error !== null

const asIs: Settle<unknown, RpcFailure> = { result: Effect.succeed, failure: (failure) => failure }

/** Calls through `post` (the RPC endpoint), batched per event-loop turn; `post` bounds each request's time. */
export const makeJsonRpcBatch = (post: PostJson, options: JsonRpcBatchOptions = {}): JsonRpcBatch => {
  const limit = options.limit ?? 50
  const retries = options.retries ?? 0
  const retryDelayMs = options.retryDelayMs ?? ((attempt: number) => 150 * 2 ** (attempt - 1))
  let queued: Array<Queued> = []

  const enqueue = (call: Queued) => {
    queued.push(call)
    if (queued.length === 1) setImmediate(flush)
  }

  /** Sends `call` again after its delay, in whatever batch is being gathered then. */
  const resend = (call: Queued) =>
    setTimeout(
      () => enqueue({ ...call, retriesLeft: call.retriesLeft - 1, attempt: call.attempt + 1 }),
      retryDelayMs(call.attempt)
    )

  /** The batch got no usable answer: each call is sent again (after its delay) or fails with `failure`. */
  const giveUpOrRetry = (batch: ReadonlyArray<Queued>, failure: RpcFailure, transient: boolean) => {
    for (const call of batch) {
      if (transient && call.retriesLeft > 0) resend(call)
      else call.resume(Effect.fail(call.settle.failure(failure)))
    }
  }

  const send = async (batch: ReadonlyArray<Queued>) => {
    const body = JSON.stringify(
      batch.map((call, id) => ({ jsonrpc: "2.0", id, method: call.method, params: call.params }))
    )
    let response: { readonly status: number; readonly body: string }
    try {
      response = await post(body)
    } catch (error) {
      const timedOut = error instanceof Error && error.name === "TimeoutError"
      giveUpOrRetry(
        batch,
        unanswered(
          timedOut,
          timedOut ? "the node did not answer in time" : "the node could not be reached or answered no JSON"
        ),
        true
      )
      return
    }
    if (response.status !== 200) {
      giveUpOrRetry(
        batch,
        unanswered(false, `HTTP ${response.status}`),
        TRANSIENT_STATUS.has(response.status)
      )
      return
    }
    let answers: unknown
    try {
      answers = JSON.parse(response.body)
    } catch {
      giveUpOrRetry(batch, unanswered(false, "the node could not be reached or answered no JSON"), false)
      return
    }
    // A batch is answered by an array of answers matched by id (in any order). A single error object
    // (a provider refusing the batch's size, or rate limiting it) is every call's answer; a single answer
    // with an id (a proxy unwrapping a batch of one) is that call's. Calls left without one: no answer.
    const byId = new Map<number, RpcAnswer>()
    const whole = isErrorAnswer(answers) ? answers : undefined
    for (const answer of (Array.isArray(answers) ? answers : [answers]) as ReadonlyArray<RpcAnswer>) {
      if (typeof answer?.id === "number") byId.set(answer.id, answer)
    }
    batch.forEach((call, id) => {
      const read = outcome(whole ?? byId.get(id))
      if (read._tag === "Result") call.resume(call.settle.result(read.result))
      else if (read.transient && call.retriesLeft > 0) resend(call)
      else call.resume(Effect.fail(call.settle.failure(read.failure)))
    })
  }

  const flush = () => {
    const all = queued
    queued = []
    for (let start = 0; start < all.length; start += limit) {
      void send(all.slice(start, start + limit))
    }
  }

  const callWith = <A, E>(
    method: string,
    params: ReadonlyArray<unknown>,
    settle: Settle<A, E>,
    callOptions?: CallOptions
  ) =>
    Effect.callback<A, E>((resume) => {
      enqueue({
        method,
        params,
        retriesLeft: callOptions?.retry === false ? 0 : retries,
        attempt: 1,
        settle: settle as Settle<unknown, unknown>,
        resume: resume as (answer: Effect.Effect<unknown, unknown>) => void
      })
    })

  return {
    call: (method, params, callOptions) => callWith(method, params, asIs, callOptions),
    callWith,
    // The turn's scheduled flush still runs, and finds nothing (or what was asked for since) to send.
    send: () => {
      if (queued.length > 0) flush()
    }
  }
}
