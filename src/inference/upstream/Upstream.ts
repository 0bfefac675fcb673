import type { Readable } from "node:stream"
import { NodeHttpClient } from "@effect/platform-node"
import {
  Array as Arr,
  Cause,
  Context,
  Duration,
  Effect,
  Layer,
  Option,
  Redacted,
  References,
  Result,
  Stream
} from "effect"
import { HttpTraceContext } from "effect/http"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import type { MessagesRequest } from "../../domain/Messages.ts"
import { NO_STACK } from "../../Telemetry.ts"
import type { UpstreamEvent } from "../Events.ts"
import {
  anthropicFrameToStep,
  chatRequestToMessagesRequest,
  initialAnthropicState
} from "./AnthropicMessages.ts"
import {
  chatRequestToUpstream,
  initialOpenAiState,
  openAiFrameToStep,
  openAiStreamComplete
} from "./OpenAiChat.ts"
import { promptTexts, redactExcerpt } from "./Redact.ts"
import { makeSseDecoder, type SseEvent } from "./Sse.ts"
import type { StreamStep } from "./StreamStep.ts"
import { UpstreamError } from "./UpstreamError.ts"
import { bodyStream, errorBodyText, letGo, post, timeoutError } from "./UpstreamHttp.ts"

export type UpstreamDialect = "openai" | "anthropic"

export interface UpstreamTarget {
  /** Without a trailing slash, e.g. `https://api.example.com`. */
  readonly baseUrl: string
  readonly dialect: UpstreamDialect
  readonly apiKey?: Redacted.Redacted<string> | undefined
}

export interface UpstreamOptions {
  /** Budget from sending the request to the first body byte. Default 30 s. */
  readonly firstByteTimeout?: Duration.Input | undefined
}

/** How one dialect is spoken: where to post, what to send, how to read the stream back. */
export interface DialectCodec<S> {
  readonly path: string
  readonly body: (request: ChatCompletionRequest, modelClass: string, maxTokens: number) => unknown
  readonly headers: (apiKey: string | undefined) => Record<string, string>
  readonly initial: S
  readonly step: (state: S, frame: SseEvent) => Result.Result<StreamStep<S>, UpstreamError>
  /** Whether a body that ends here (without the terminal frame) still carried a whole reply. */
  readonly completeAtEnd: (state: S) => boolean
}

export const openAiCodec: DialectCodec<typeof initialOpenAiState> = {
  path: "/v1/chat/completions",
  body: chatRequestToUpstream,
  headers: (apiKey): Record<string, string> =>
    apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` },
  initial: initialOpenAiState,
  step: openAiFrameToStep,
  completeAtEnd: openAiStreamComplete
}

export const anthropicCodec: DialectCodec<typeof initialAnthropicState> = {
  path: "/v1/messages",
  // What is sent is a request of the one Messages wire schema (domain/Messages.ts).
  body: (request, modelClass, maxTokens): MessagesRequest =>
    chatRequestToMessagesRequest(request, modelClass, maxTokens),
  headers: (apiKey) => ({
    "anthropic-version": "2023-06-01",
    ...(apiKey === undefined ? {} : { "x-api-key": apiKey })
  }),
  initial: initialAnthropicState,
  step: anthropicFrameToStep,
  // A Messages reply is whole only after `message_stop`, which ends reading before the body does.
  completeAtEnd: () => false
}

const dropped = (message: string) => new UpstreamError({ reason: "dropped", message })

/**
 * Body bytes to dialect-neutral events, one piece at a time: the SSE decoder and the dialect's state.
 * Reading stops at the terminal frame (`finished`); a failure found after some events of the same
 * piece is kept (`failure`) so those events go out first; the end of the body lets the dialect judge
 * whether the reply was whole.
 */
const makeBodyDecoder = <S>(codec: DialectCodec<S>) => {
  const sse = makeSseDecoder()
  let state = codec.initial
  const decoder = {
    finished: false,
    failure: undefined as UpstreamError | undefined,
    /** The events of these frames, up to the terminal frame (then `finished`), or the first failure. */
    frames: (frames: ReadonlyArray<SseEvent>, events: Array<UpstreamEvent>) => {
      for (const frame of frames) {
        const stepped = codec.step(state, frame)
        if (Result.isFailure(stepped)) {
          decoder.failure = stepped.failure
          return
        }
        state = stepped.success.state
        for (const event of stepped.success.events) events.push(event)
        if (stepped.success.done) {
          decoder.finished = true
          return
        }
      }
    },
    /** The events of these body pieces; `undefined`: the body ended. */
    pieces: (chunks: ReadonlyArray<Uint8Array> | undefined, events: Array<UpstreamEvent>) => {
      if (chunks === undefined) {
        decoder.frames(sse.end(), events)
        if (!decoder.finished && decoder.failure === undefined) {
          if (codec.completeAtEnd(state)) decoder.finished = true
          else decoder.failure = dropped("upstream stream ended before its terminal event")
        }
        return
      }
      for (const chunk of chunks) {
        if (decoder.finished || decoder.failure !== undefined) return
        decoder.frames(sse.push(chunk), events)
      }
    }
  }
  return decoder
}

const brokeOff = (error: unknown) =>
  error instanceof UpstreamError ? error : dropped("upstream body broke off before the reply ended")

/**
 * Raw body bytes to dialect-neutral events, as they arrive. Reading stops at the terminal
 * frame; a body that ends (or breaks) before it fails with `dropped`; the end of the body lets
 * the dialect judge whether the reply was whole. `firstPullMillis` bounds the wait for the first
 * piece of the body (later pieces may take any time); `redact` is applied to every failure.
 *
 * One stream stage, not one per step (bytes → frames → events → up to the terminal frame): a held
 * stream keeps every stage's pull, closures and scope for as long as it is open (issue 12 item 5, D305).
 */
export const decodeUpstreamStream = <S, E>(
  codec: DialectCodec<S>,
  bytes: Stream.Stream<Uint8Array, E>,
  options: {
    readonly firstPullMillis?: number | undefined
    readonly redact?: ((error: UpstreamError) => UpstreamError) | undefined
  } = {}
): Stream.Stream<UpstreamEvent, UpstreamError> =>
  Stream.transformPull(bytes, (pull) =>
    Effect.sync(() => {
      const decoder = makeBodyDecoder(codec)
      const { firstPullMillis, redact = (error: UpstreamError) => error } = options
      let first = firstPullMillis !== undefined
      const read = Effect.catch(pull, (error) =>
        Cause.isDone(error) ? Effect.succeed(undefined) : Effect.fail(brokeOff(error))
      )
      const nextPiece = Effect.suspend(() => {
        if (!first) return read
        first = false
        return Effect.timeoutOrElse(read, {
          duration: firstPullMillis!,
          orElse: () => Effect.fail(timeoutError())
        })
      })
      const pullEvents: Effect.Effect<
        Arr.NonEmptyReadonlyArray<UpstreamEvent>,
        UpstreamError | Cause.Done
      > = Effect.gen(function* () {
        while (true) {
          if (decoder.failure !== undefined) return yield* Effect.fail(redact(decoder.failure))
          if (decoder.finished) return yield* Cause.done()
          const chunks = yield* Effect.mapError(nextPiece, redact)
          const events: Array<UpstreamEvent> = []
          decoder.pieces(chunks, events)
          if (Arr.isArrayNonEmpty(events)) return events
        }
      })
      return pullEvents
    })
  )

/** Pieces a Node body may buffer ahead of its reader before it is paused. */
const AHEAD = 64

/**
 * The pieces of a Node body as they arrive, without a stream of its own: each read takes what came
 * since the last (a body more than `AHEAD` pieces ahead is paused until then), or waits for more
 * (`undefined` once the body ended). Interrupting a read, and `close`, destroy the body, which aborts
 * its request.
 */
const nodeBodyReader = (body: Readable) => {
  let pending: Array<Uint8Array> = []
  let wake: (() => void) | undefined
  let failed: unknown
  let ended = false
  const onData = (piece: Uint8Array) => {
    pending.push(piece)
    if (pending.length >= AHEAD) body.pause()
    wake?.()
  }
  const onEnd = () => {
    ended = true
    wake?.()
  }
  const onError = (error: unknown) => {
    failed = error
    wake?.()
  }
  // Closed without its end or an error (torn down under it): broken off, as `finished` would say.
  const onClose = () => {
    if (!ended && failed === undefined) onError(new Error("premature close"))
  }
  body.on("data", onData)
  body.on("end", onEnd)
  body.on("error", onError)
  body.on("close", onClose)
  const close = () => {
    wake = undefined
    body.off("data", onData)
    body.off("end", onEnd)
    body.off("error", onError)
    body.off("close", onClose)
    letGo(body)
  }
  /**
   * The reply is decoded whole (its terminal frame came): the body's end is usually already parsed, its
   * `end` event a tick away. Torn down before that event, undici makes (and stack-traces) an abort error
   * for a finished response, per call (D470). So what is left is read and dropped until the next turn
   * of the event loop, and only a body still open then is let go.
   */
  const finish = () => {
    if (ended || failed !== undefined || body.destroyed) return close()
    wake = undefined
    body.off("data", onData)
    body.off("end", onEnd)
    body.off("close", onClose)
    body.on("error", ignoreError)
    body.resume()
    setImmediate(letGoUnlessEnded, body)
  }
  const read: Effect.Effect<ReadonlyArray<Uint8Array> | undefined, UpstreamError> = Effect.callback(
    (resume) => {
      const settle = () => {
        wake = undefined
        if (pending.length > 0) {
          const pieces = pending
          pending = []
          if (body.isPaused()) body.resume()
          resume(Effect.succeed(pieces))
        } else if (failed !== undefined) resume(Effect.fail(brokeOff(failed)))
        else if (ended) resume(Effect.succeed(undefined))
        else wake = settle
      }
      settle()
      return Effect.sync(close)
    }
  )
  return { read, close, finish }
}

const ignoreError = () => {}

const letGoUnlessEnded = (body: Readable) => {
  if (!body.readableEnded) letGo(body)
}

/**
 * Reads a Node body straight into `onEvent`, in the calling fiber: no stream stages, pulls or scopes
 * held while the reply is open (issue 12 item 5).
 */
const readNodeBody = <S>(
  codec: DialectCodec<S>,
  body: Readable,
  onEvent: (event: UpstreamEvent) => Effect.Effect<void>
): Effect.Effect<void, UpstreamError> =>
  Effect.suspend(() => {
    const decoder = makeBodyDecoder(codec)
    const reader = nodeBodyReader(body)
    let finished = false
    return Effect.gen(function* () {
      // A late first byte: the call's timer destroys the body with `timeout` (UpstreamHttp.ts).
      let chunks = yield* reader.read
      const events: Array<UpstreamEvent> = []
      while (true) {
        decoder.pieces(chunks, events)
        for (const event of events) yield* onEvent(event)
        events.length = 0
        if (decoder.failure !== undefined) return yield* Effect.fail(decoder.failure)
        if (decoder.finished) {
          finished = true
          return
        }
        chunks = yield* reader.read
      }
    }).pipe(Effect.ensuring(Effect.sync(() => (finished ? reader.finish() : reader.close()))))
  })

/** The `type: message` of a JSON error body, else the body as sent. */
const errorBodySummary = (body: string): string => {
  const parsed = Option.liftThrowable(JSON.parse)(body)
  if (Option.isNone(parsed)) return body
  const value: unknown = parsed.value
  const error = typeof value === "object" && value !== null && "error" in value ? value.error : undefined
  if (typeof error === "object" && error !== null) {
    const type = "type" in error && typeof error.type === "string" ? error.type : undefined
    const message = "message" in error && typeof error.message === "string" ? error.message : undefined
    if (type !== undefined || message !== undefined) return [type, message].filter(Boolean).join(": ")
  }
  return body
}

export const make = Effect.fnUntraced(function* (options: UpstreamOptions = {}) {
  const timeoutMillis = Duration.toMillis(
    Duration.fromInputUnsafe(options.firstByteTimeout ?? Duration.seconds(30))
  )
  // The head and then the first body byte within the budget: one timer, no fiber (UpstreamHttp.ts).
  const dispatcher = yield* NodeHttpClient.Dispatcher
  /**
   * Where spans are exported: the call as a client span (the head, as the HTTP client's was) whose
   * context goes to the provider in the trace headers.
   */
  const tracedPost = (url: URL, headers: Record<string, string>, body: string) =>
    Effect.useSpan(
      "POST",
      { kind: "client", attributes: { "http.request.method": "POST", "url.full": url.href }, ...NO_STACK },
      (span) =>
        post(dispatcher, url, { ...headers, ...HttpTraceContext.toHeaders(span) }, body, timeoutMillis).pipe(
          Effect.tap((response) =>
            Effect.sync(() => span.attribute("http.response.status_code", response.status))
          )
        )
    )

  /** The request sent and its head read: a 2xx event stream (its first byte still held to the budget). */
  const open = <S>(
    codec: DialectCodec<S>,
    target: UpstreamTarget,
    apiKey: string | undefined,
    request: ChatCompletionRequest,
    modelClass: string,
    maxTokens: number
  ) =>
    Effect.gen(function* () {
      const url = new URL(`${target.baseUrl}${codec.path}`)
      const headers = { accept: "text/event-stream", ...codec.headers(apiKey) }
      const body = JSON.stringify(codec.body(request, modelClass, maxTokens))
      const response = yield* Effect.withFiber((fiber) =>
        fiber.getRef(References.TracerEnabled)
          ? tracedPost(url, headers, body)
          : post(dispatcher, url, headers, body, timeoutMillis)
      )
      if (response.status < 200 || response.status >= 300) {
        const text = yield* errorBodyText(response)
        return yield* new UpstreamError({
          reason: "http_status",
          message: `upstream answered ${response.status}`,
          status: response.status,
          excerpt: errorBodySummary(text)
        })
      }
      // A provider that ignored `stream: true` answers with one JSON document, not events.
      if ((response.headers["content-type"] ?? "").includes("application/json")) {
        letGo(response.body)
        return yield* new UpstreamError({
          reason: "protocol",
          message: "upstream answered with JSON instead of an event stream"
        })
      }
      return response
    })

  /** Every failure's excerpt with the prompt's texts and the key taken out. */
  const redactFor = (request: ChatCompletionRequest, apiKey: string | undefined) => (error: UpstreamError) =>
    error.excerpt === undefined
      ? error
      : new UpstreamError({
          reason: error.reason,
          message: error.message,
          status: error.status,
          excerpt: redactExcerpt(error.excerpt, promptTexts(request), apiKey === undefined ? [] : [apiKey])
        })

  const codecOf = (dialect: UpstreamDialect): DialectCodec<unknown> =>
    (dialect === "openai" ? openAiCodec : anthropicCodec) as DialectCodec<unknown>

  const stream = (
    target: UpstreamTarget,
    request: ChatCompletionRequest,
    modelClass: string,
    maxTokens: number
  ): Stream.Stream<UpstreamEvent, UpstreamError> => {
    const apiKey = target.apiKey === undefined ? undefined : Redacted.value(target.apiKey)
    const redact = redactFor(request, apiKey)
    const codec = codecOf(target.dialect)
    return Stream.unwrap(
      open(codec, target, apiKey, request, modelClass, maxTokens).pipe(
        Effect.map((response) => decodeUpstreamStream(codec, bodyStream(response), { redact })),
        Effect.mapError(redact)
      )
    )
  }

  const run = (
    target: UpstreamTarget,
    request: ChatCompletionRequest,
    modelClass: string,
    maxTokens: number,
    onEvent: (event: UpstreamEvent) => Effect.Effect<void>
  ): Effect.Effect<void, UpstreamError> => {
    const apiKey = target.apiKey === undefined ? undefined : Redacted.value(target.apiKey)
    const redact = redactFor(request, apiKey)
    const codec = codecOf(target.dialect)
    return open(codec, target, apiKey, request, modelClass, maxTokens).pipe(
      Effect.flatMap((response) => readNodeBody(codec, response.body, onEvent)),
      Effect.mapError(redact)
    )
  }

  return { stream, run }
})

/**
 * Streams one completion from an upstream provider in its own dialect, translated to
 * dialect-neutral events as they arrive. No retries: falling back to another provider is the
 * router's decision. Interrupting the consuming fiber aborts the HTTP request.
 */
export class Upstream extends Context.Service<
  Upstream,
  {
    readonly stream: (
      target: UpstreamTarget,
      request: ChatCompletionRequest,
      modelClass: string,
      maxTokens: number
    ) => Stream.Stream<UpstreamEvent, UpstreamError>
    /**
     * The same reply, each event handed to `onEvent` as it arrives, in the calling fiber. The router's
     * undici body is read directly (no stream stages held while a reply is open, issue 12 item 5).
     */
    readonly run: (
      target: UpstreamTarget,
      request: ChatCompletionRequest,
      modelClass: string,
      maxTokens: number,
      onEvent: (event: UpstreamEvent) => Effect.Effect<void>
    ) => Effect.Effect<void, UpstreamError>
  }
>()("router/inference/Upstream") {
  static readonly layerWith = (options: UpstreamOptions) => Layer.effect(Upstream, make(options))
  static readonly layer = Upstream.layerWith({})
  /**
   * The router's: undici's own request API (keep-alive pools per origin), not `fetch` over it: a
   * held-open stream then holds a Node stream, not fetch's Request, Response, Headers and web streams.
   */
  static readonly layerUndici = Upstream.layer.pipe(Layer.provide(NodeHttpClient.layerDispatcher))

  /** Scripted replies (by target and class), for tests of what serves through upstreams. */
  static readonly layerTest = (stream: Upstream["Service"]["stream"]) =>
    Layer.succeed(
      Upstream,
      Upstream.of({
        stream,
        run: (target, request, modelClass, maxTokens, onEvent) =>
          Stream.runForEach(stream(target, request, modelClass, maxTokens), onEvent)
      })
    )
}
