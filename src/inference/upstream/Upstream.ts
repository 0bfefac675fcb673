import { NodeHttpClient } from "@effect/platform-node"
import {
  Array as Arr,
  Cause,
  Clock,
  Context,
  Duration,
  Effect,
  Layer,
  Option,
  Redacted,
  Result,
  Stream
} from "effect"
import { HttpClient, type HttpClientError, HttpClientRequest, type HttpClientResponse } from "effect/http"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import type { MessagesRequest } from "../../domain/Messages.ts"
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

const timeoutError = () =>
  new UpstreamError({ reason: "timeout", message: "upstream sent no first byte within the timeout" })

const dropped = (message: string) => new UpstreamError({ reason: "dropped", message })

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
      const sse = makeSseDecoder()
      let state = codec.initial
      let finished = false
      /** A failure found after some events of the same piece: told on the next pull, once those are out. */
      let failure: UpstreamError | undefined
      const { firstPullMillis, redact = (error: UpstreamError) => error } = options
      let first = firstPullMillis !== undefined
      const read = Effect.catch(pull, (error) =>
        Cause.isDone(error)
          ? Effect.succeed(undefined)
          : Effect.fail(
              error instanceof UpstreamError
                ? error
                : dropped("upstream body broke off before the reply ended")
            )
      )
      const nextPiece = Effect.suspend(() => {
        if (!first) return read
        first = false
        return Effect.timeoutOrElse(read, {
          duration: firstPullMillis!,
          orElse: () => Effect.fail(timeoutError())
        })
      })
      /** The events of these frames, up to the terminal frame (then `finished`), or the first failure. */
      const step = (frames: ReadonlyArray<SseEvent>, events: Array<UpstreamEvent>) => {
        for (const frame of frames) {
          const stepped = codec.step(state, frame)
          if (Result.isFailure(stepped)) {
            failure = stepped.failure
            return
          }
          state = stepped.success.state
          for (const event of stepped.success.events) events.push(event)
          if (stepped.success.done) {
            finished = true
            return
          }
        }
      }
      const pullEvents: Effect.Effect<
        Arr.NonEmptyReadonlyArray<UpstreamEvent>,
        UpstreamError | Cause.Done
      > = Effect.gen(function* () {
        while (true) {
          if (failure !== undefined) return yield* Effect.fail(redact(failure))
          if (finished) return yield* Cause.done()
          const chunks = yield* Effect.mapError(nextPiece, redact)
          const events: Array<UpstreamEvent> = []
          if (chunks === undefined) {
            step(sse.end(), events)
            if (!finished && failure === undefined) {
              if (codec.completeAtEnd(state)) finished = true
              else failure = dropped("upstream stream ended before its terminal event")
            }
          } else {
            for (const chunk of chunks) {
              if (finished || failure !== undefined) break
              step(sse.push(chunk), events)
            }
          }
          if (Arr.isArrayNonEmpty(events)) return events
        }
      })
      return pullEvents
    })
  )

/** The system error code (`ECONNREFUSED`, ...) somewhere down a fetch failure's cause chain. */
const errorCode = (error: unknown, depth = 0): string | undefined => {
  if (typeof error !== "object" || error === null || depth > 4) return undefined
  if ("code" in error && typeof error.code === "string") return error.code
  return "cause" in error ? errorCode(error.cause, depth + 1) : undefined
}

const connectError = (error: HttpClientError.HttpClientError) => {
  const code = errorCode(error.reason.cause)
  return new UpstreamError({
    reason: "connect",
    message: `could not reach upstream (${error.reason._tag}${typeof code === "string" ? `: ${code}` : ""})`
  })
}

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

/** A bounded read of an error body: a provider streaming garbage cannot hold the call open. */
const readErrorBody = (response: HttpClientResponse.HttpClientResponse) =>
  response.stream.pipe(
    Stream.decodeText(),
    Stream.scan(
      () => "",
      (text, piece: string) => text + piece
    ),
    Stream.takeUntil((text) => text.length >= 4096),
    Stream.runLast,
    Effect.map(Option.getOrElse(() => "")),
    Effect.timeoutOrElse({ duration: "2 seconds", orElse: () => Effect.succeed("") }),
    Effect.orElseSucceed(() => "")
  )

export const make = Effect.fnUntraced(function* (options: UpstreamOptions = {}) {
  const timeout = Duration.fromInputUnsafe(options.firstByteTimeout ?? Duration.seconds(30))
  const timeoutMillis = Duration.toMillis(timeout)
  // The head must come within the budget; `stream` holds the first body byte to what is left.
  const client = HttpClient.transform(yield* HttpClient.HttpClient, (effect) =>
    Effect.timeoutOrElse(effect, { duration: timeout, orElse: () => Effect.fail(timeoutError()) })
  )

  const stream = (
    target: UpstreamTarget,
    request: ChatCompletionRequest,
    modelClass: string,
    maxTokens: number
  ): Stream.Stream<UpstreamEvent, UpstreamError> => {
    const apiKey = target.apiKey === undefined ? undefined : Redacted.value(target.apiKey)
    const redact = (error: UpstreamError) =>
      error.excerpt === undefined
        ? error
        : new UpstreamError({
            reason: error.reason,
            message: error.message,
            status: error.status,
            excerpt: redactExcerpt(error.excerpt, promptTexts(request), apiKey === undefined ? [] : [apiKey])
          })
    const events = <S>(codec: DialectCodec<S>) =>
      Stream.unwrap(
        Effect.gen(function* () {
          const httpRequest = HttpClientRequest.post(`${target.baseUrl}${codec.path}`).pipe(
            HttpClientRequest.setHeaders({ accept: "text/event-stream", ...codec.headers(apiKey) }),
            HttpClientRequest.bodyJsonUnsafe(codec.body(request, modelClass, maxTokens))
          )
          const started = yield* Clock.currentTimeMillis
          const response = yield* client
            .execute(httpRequest)
            .pipe(Effect.mapError((error) => (error._tag === "UpstreamError" ? error : connectError(error))))
          if (response.status < 200 || response.status >= 300) {
            const body = yield* readErrorBody(response)
            return yield* new UpstreamError({
              reason: "http_status",
              message: `upstream answered ${response.status}`,
              status: response.status,
              excerpt: errorBodySummary(body)
            })
          }
          // A provider that ignored `stream: true` answers with one JSON document, not events.
          if ((response.headers["content-type"] ?? "").includes("application/json")) {
            return yield* new UpstreamError({
              reason: "protocol",
              message: "upstream answered with JSON instead of an event stream"
            })
          }
          const left = Math.max(0, timeoutMillis - ((yield* Clock.currentTimeMillis) - started))
          return decodeUpstreamStream(codec, response.stream, { firstPullMillis: left, redact })
        }).pipe(Effect.mapError(redact))
      )
    return target.dialect === "openai" ? events(openAiCodec) : events(anthropicCodec)
  }

  return { stream }
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
  }
>()("router/inference/Upstream") {
  static readonly layerWith = (options: UpstreamOptions) => Layer.effect(Upstream, make(options))
  static readonly layer = Upstream.layerWith({})
  /**
   * The router's: undici's own request API (keep-alive pools per origin), not `fetch` over it: a
   * held-open stream then holds a Node stream, not fetch's Request, Response, Headers and web streams.
   */
  static readonly layerUndici = Upstream.layer.pipe(Layer.provide(NodeHttpClient.layerUndici))

  /** Scripted replies (by target and class), for tests of what serves through upstreams. */
  static readonly layerTest = (stream: Upstream["Service"]["stream"]) =>
    Layer.succeed(Upstream, Upstream.of({ stream }))
}
