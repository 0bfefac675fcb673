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
import { bodyStream, errorBodyText, post, timeoutError, type UpstreamResponse } from "./UpstreamHttp.ts"

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

/**
 * Reads the response's body straight into `onEvents`, in the calling fiber: no stream stages, pulls or
 * scopes held while the reply is open (issue 12 item 5), and one call per read, with the events decoded from
 * it (a step per read, not per event: D565). A loop of continuations, not a generator: a held reply waits in
 * a read with one small continuation on its fiber's stack, where a generator kept its registers (the last
 * pieces read among them, D501). A failure decoded from the body (a provider's error frame, which may quote
 * the prompt) is `redact`ed here, after the events before it went out; a failed read (`timeout`, `dropped`)
 * carries no excerpt.
 */
const readBody = <S>(
  codec: DialectCodec<S>,
  response: UpstreamResponse,
  onEvents: (events: ReadonlyArray<UpstreamEvent>) => Effect.Effect<void>,
  redact: (error: UpstreamError) => UpstreamError
): Effect.Effect<void, UpstreamError> =>
  Effect.suspend(() => {
    const decoder = makeBodyDecoder(codec)
    let finished = false
    // After the events of the last read: the failure or the end they ended with, or the next read.
    const after = (): Effect.Effect<void, UpstreamError> => {
      if (decoder.failure !== undefined) return Effect.fail(redact(decoder.failure))
      if (decoder.finished) {
        finished = true
        return Effect.void
      }
      return next
    }
    // A late first byte: the call's timer fails the read with `timeout` (UpstreamHttp.ts).
    const next: Effect.Effect<void, UpstreamError> = Effect.flatMap(response.read, (chunks) => {
      // A new array each read: the handler may keep what it is given.
      const events: Array<UpstreamEvent> = []
      decoder.pieces(chunks, events)
      return events.length === 0 ? after() : Effect.flatMap(onEvents(events), after)
    })
    return next.pipe(Effect.ensuring(Effect.sync(() => (finished ? response.finish() : response.close()))))
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
      if (response.contentType.includes("application/json")) {
        response.close()
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
    onEvents: (events: ReadonlyArray<UpstreamEvent>) => Effect.Effect<void>
  ): Effect.Effect<void, UpstreamError> => {
    const apiKey = target.apiKey === undefined ? undefined : Redacted.value(target.apiKey)
    const redact = redactFor(request, apiKey)
    const codec = codecOf(target.dialect)
    // Redacted apart: while the body is read, the fiber keeps no frame over the call's opening.
    return Effect.flatMap(
      Effect.mapError(open(codec, target, apiKey, request, modelClass, maxTokens), redact),
      (response) => readBody(codec, response, onEvents, redact)
    )
  }

  return { stream, run }
})

/**
 * The longest an idle upstream connection is kept (D505). undici keeps one 4 s, or as long as the server's
 * keep-alive hint says, up to 10 minutes: after a burst of 5,000 streams to a server hinting 60 s, 5,000 idle
 * sockets (about 5 KB of heap each, and their kernel buffers) outlived the load by a minute. A router under
 * steady traffic reuses its connections long before this; a provider's next call after a quiet spell opens one.
 */
export const UPSTREAM_IDLE_MAX_MS = 10_000

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
     * The same reply, handed to `onEvents` as it arrives, in the calling fiber: the events of each read
     * of the body, in order, never empty (D565). The call's body is read directly (no stream stages held
     * while a reply is open, issue 12 item 5). `onEvents` is called again only once the effect it returned
     * has run, and that effect runs at once: a handler may record events when called (D536).
     */
    readonly run: (
      target: UpstreamTarget,
      request: ChatCompletionRequest,
      modelClass: string,
      maxTokens: number,
      onEvents: (events: ReadonlyArray<UpstreamEvent>) => Effect.Effect<void>
    ) => Effect.Effect<void, UpstreamError>
  }
>()("router/inference/Upstream") {
  static readonly layerWith = (options: UpstreamOptions) => Layer.effect(Upstream, make(options))
  static readonly layer = Upstream.layerWith({})
  /** The router's pools, an idle connection kept at most `idleMaxMs` whatever the server's keep-alive hint. */
  static readonly layerUndiciWith = (idleMaxMs: number) =>
    Upstream.layer.pipe(
      Layer.provide(NodeHttpClient.layerDispatcherOptions({ keepAliveMaxTimeout: idleMaxMs }))
    )
  /**
   * The router's: undici's dispatcher (keep-alive pools per origin), not `fetch` over it: a held-open
   * stream then holds one call record (UpstreamHttp.ts), not fetch's Request, Response, Headers and web
   * streams.
   */
  static readonly layerUndici = Upstream.layerUndiciWith(UPSTREAM_IDLE_MAX_MS)

  /** Scripted replies (by target and class), for tests of what serves through upstreams. */
  static readonly layerTest = (stream: Upstream["Service"]["stream"]) =>
    Layer.succeed(
      Upstream,
      Upstream.of({
        stream,
        // A script's chunks as reads: its events in one call each (`Stream.fromIterable`: all at once).
        run: (target, request, modelClass, maxTokens, onEvents) =>
          Stream.runForEachArray(stream(target, request, modelClass, maxTokens), onEvents)
      })
    )
}
