import { createServer } from "node:http"
import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { Clock, Context, Effect, Exit, Layer, Random, Ref, Schema, Stream } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { ServeError } from "effect/http/HttpServerError"
import type { Scope } from "effect/Scope"
import {
  DEFAULT_IMAGE_SIZE,
  ImageGenerationRequest,
  type ImagesResponse,
  isImageSize
} from "../../domain/Images.ts"
import { AnthropicDialect } from "./AnthropicDialect.ts"
import type { Dialect, DialectErrorKind, DialectName, ReplyMeta, SseFrame } from "./Dialect.ts"
import { OpenAiDialect } from "./OpenAiDialect.ts"
import { renderPrompt } from "./Png.ts"
import { markersFor, type SimReply, simulate, wantsRich } from "./Simulator.ts"

/**
 * One simulated upstream provider: an HTTP server on 127.0.0.1 (ephemeral port) speaking one
 * dialect.
 *
 * - openai: `POST /v1/chat/completions`, JSON or SSE `chat.completion.chunk`s; the final usage
 *   chunk is always sent, then `data: [DONE]`.
 * - anthropic: `POST /v1/messages`, a Messages object or the Messages event stream.
 * - The `model` field must be one of the provider's model class ids, else 404.
 * - Grounded replies (class `grounded-medium`) carry `svc_sources: [{id, title, url, snippet}]`
 *   at the top level of the completion / message object (streaming: on the first chunk, or on
 *   `message_start.message`); `[n]` in the text cites the source whose id is `"n"`.
 *
 * - Image classes (`image-*`): `POST /v1/images/generations` in OpenAI's images shape, whatever
 *   the provider's chat dialect; one real PNG per request as `b64_json` (sizes 256x256 (default),
 *   512x512, 1024x1024), after `ttftMs`.
 *
 * Faults come from markers in the last user message or the image prompt (`[[sim:slow]]`,
 * `[[sim:error]]`, `[[sim:drop]]`, each optionally `@<provider_id>`) or from the provider's
 * default faults.
 */

export interface SimFaults {
  readonly alwaysError?: boolean | undefined
  readonly alwaysSlow?: boolean | undefined
  readonly alwaysDrop?: boolean | undefined
}

export interface ProviderServerOptions {
  readonly providerId: string
  readonly dialect: DialectName
  /** Model class ids this provider serves; the request's `model` must be one of them. */
  readonly modelClasses: ReadonlyArray<string>
  readonly ttftMs: number
  readonly tokensPerSecond: number
  readonly maxContext: number
  readonly faults?: SimFaults | undefined
}

export interface ProviderCounters {
  /** Every request seen, by path (query string dropped), whether routed or not. */
  readonly requests: Readonly<Record<string, number>>
  readonly tokensProduced: number
  readonly streamsStarted: number
  readonly streamsCompleted: number
  /** Streams that ended because the client went away. */
  readonly streamsAborted: number
  readonly imagesRendered: number
  readonly faults: { readonly slow: number; readonly error: number; readonly drop: number }
}

export interface ProviderServerHandle {
  readonly providerId: string
  readonly dialect: DialectName
  readonly modelClasses: ReadonlyArray<string>
  /** `http://127.0.0.1:<port>`, without a trailing slash. */
  readonly baseUrl: string
  readonly counters: Effect.Effect<ProviderCounters>
  readonly setFaults: (faults: SimFaults) => Effect.Effect<void>
}

export const dialects: Readonly<Record<DialectName, Dialect>> = {
  openai: OpenAiDialect,
  anthropic: AnthropicDialect
}

const emptyCounters: ProviderCounters = {
  requests: {},
  tokensProduced: 0,
  streamsStarted: 0,
  streamsCompleted: 0,
  streamsAborted: 0,
  imagesRendered: 0,
  faults: { slow: 0, error: 0, drop: 0 }
}

const decodeImageRequest = Schema.decodeUnknownEffect(ImageGenerationRequest)

/** How many tokens a dropped stream delivers before the connection is cut. */
export const dropAfterTokens = 3
const slowFactor = 10
const minTickMs = 10

/**
 * Ends the connection under a response in progress: the socket flushes what was written and
 * closes, so the client sees a body cut short (no final chunk). The request fiber is then
 * interrupted by the server, which stops the stream.
 */
const cutConnection = (request: HttpServerRequest.HttpServerRequest) =>
  Effect.sync(() => NodeHttpServerRequest.toServerResponse(request).socket?.end()).pipe(
    Effect.andThen(Effect.never)
  )

interface Tick {
  readonly delayMs: number
  readonly text: string
  readonly tokens: number
}

/**
 * Groups frames into timed writes: the first token after `ttftMs`, then `tokensPerTick` tokens
 * every tick. Zero-token frames ride with the next token (or the last write).
 */
export const pace = (
  frames: ReadonlyArray<SseFrame>,
  timing: { readonly ttftMs: number; readonly tokensPerSecond: number }
): ReadonlyArray<Tick> => {
  const tickMs = Math.max(1000 / timing.tokensPerSecond, minTickMs)
  const tokensPerTick = Math.max(1, Math.round((tickMs * timing.tokensPerSecond) / 1000))
  const ticks: Array<Tick> = []
  let text = ""
  let tokens = 0
  for (const frame of frames) {
    text += frame.text
    tokens += frame.tokens
    if (tokens >= tokensPerTick || (ticks.length === 0 && tokens > 0)) {
      ticks.push({ delayMs: ticks.length === 0 ? timing.ttftMs : tickMs, text, tokens })
      text = ""
      tokens = 0
    }
  }
  if (text.length > 0 || ticks.length === 0) {
    ticks.push({ delayMs: ticks.length === 0 ? timing.ttftMs : tokens > 0 ? tickMs : 0, text, tokens })
  }
  return ticks
}

/** The frames of a stream cut right after its `afterTokens`-th token. */
const truncateFrames = (frames: ReadonlyArray<SseFrame>, afterTokens: number): ReadonlyArray<SseFrame> => {
  const out: Array<SseFrame> = []
  let tokens = 0
  for (const frame of frames) {
    if (tokens >= afterTokens) break
    out.push(frame)
    tokens += frame.tokens
  }
  return out
}

export const make = Effect.fn("ProviderServer.make")(function* (
  options: ProviderServerOptions
): Effect.fn.Return<ProviderServerHandle, ServeError, Scope> {
  const dialect = dialects[options.dialect]
  const counters = yield* Ref.make(emptyCounters)
  const defaultFaults = yield* Ref.make<SimFaults>(options.faults ?? {})
  const encoder = new TextEncoder()
  const update = (f: (c: ProviderCounters) => ProviderCounters) => Ref.update(counters, f)
  const countFault = (kind: keyof ProviderCounters["faults"]) =>
    update((c) => ({ ...c, faults: { ...c.faults, [kind]: c.faults[kind] + 1 } }))
  const addTokens = (n: number) => update((c) => ({ ...c, tokensProduced: c.tokensProduced + n }))

  const errorResponse = (kind: DialectErrorKind, message: string) =>
    HttpServerResponse.jsonUnsafe(dialect.errorBody(kind, message), { status: dialect.errorStatus(kind) })

  const replyMeta = Effect.gen(function* () {
    const created = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    const a = yield* Random.nextIntBetween(0, 0xffffffff)
    const b = yield* Random.nextIntBetween(0, 0xffffffff)
    const hex = a.toString(16).padStart(8, "0") + b.toString(16).padStart(8, "0")
    return (model: string): ReplyMeta => ({
      id: options.dialect === "openai" ? `chatcmpl-${hex}` : `msg_${hex}`,
      model,
      created
    })
  })

  const streamResponse = (
    request: HttpServerRequest.HttpServerRequest,
    reply: SimReply,
    meta: ReplyMeta,
    ttftMs: number,
    drop: boolean
  ) => {
    const frames = dialect.streamFrames(reply, meta)
    const ticks = pace(drop ? truncateFrames(frames, dropAfterTokens) : frames, {
      ttftMs,
      tokensPerSecond: options.tokensPerSecond
    })
    const body = Stream.fromIterable(ticks).pipe(
      Stream.mapEffect((tick) =>
        Effect.sleep(tick.delayMs).pipe(
          Effect.andThen(addTokens(tick.tokens)),
          Effect.as(encoder.encode(tick.text))
        )
      ),
      (stream) => (drop ? Stream.concat(stream, Stream.fromEffect(cutConnection(request))) : stream),
      Stream.onExit((exit) =>
        Exit.isSuccess(exit)
          ? update((c) => ({ ...c, streamsCompleted: c.streamsCompleted + 1 }))
          : Exit.hasInterrupts(exit) && !drop
            ? update((c) => ({ ...c, streamsAborted: c.streamsAborted + 1 }))
            : Effect.void
      )
    )
    return update((c) => ({ ...c, streamsStarted: c.streamsStarted + 1 })).pipe(
      Effect.as(
        HttpServerResponse.stream(body, {
          contentType: "text/event-stream",
          headers: { "cache-control": "no-cache", "x-sim-provider": options.providerId }
        })
      )
    )
  }

  const complete = Effect.fn("ProviderServer.complete")(function* (
    request: HttpServerRequest.HttpServerRequest
  ) {
    const json = yield* request.json.pipe(Effect.option)
    if (json._tag === "None") return errorResponse("invalid_request", "request body is not valid JSON")
    const decoded = yield* dialect.decode(json.value).pipe(Effect.result)
    if (decoded._tag === "Failure") return errorResponse("invalid_request", decoded.failure.message)
    const { model, stream, request: simRequest } = decoded.success
    if (!options.modelClasses.includes(model)) {
      return errorResponse("not_found", `model '${model}' is not served by ${options.providerId}`)
    }
    const markers = markersFor(simRequest.lastUserText, options.providerId)
    const faults = yield* Ref.get(defaultFaults)
    if (markers.error || faults.alwaysError === true) {
      yield* countFault("error")
      return errorResponse("server_error", `simulated upstream failure at ${options.providerId}`)
    }
    const reply = simulate(
      { ...simRequest, modelClass: model },
      {
        multiTool: markers.multiTool,
        long: markers.long,
        rich: wantsRich(simRequest.lastUserText, options.providerId)
      }
    )
    if (reply.promptTokens > options.maxContext) {
      return errorResponse(
        "invalid_request",
        `prompt of ${reply.promptTokens} tokens exceeds ${options.maxContext}`
      )
    }
    const slow = markers.slow || faults.alwaysSlow === true
    const drop = markers.drop || faults.alwaysDrop === true
    if (slow) yield* countFault("slow")
    if (drop) yield* countFault("drop")
    const ttftMs = options.ttftMs * (slow ? slowFactor : 1)
    const meta = (yield* replyMeta)(model)
    if (stream) return yield* streamResponse(request, reply, meta, ttftMs, drop)

    yield* Effect.sleep(ttftMs + Math.round((reply.completionTokens * 1000) / options.tokensPerSecond))
    if (drop) {
      const partial = JSON.stringify(dialect.completion(reply, meta)).slice(0, 24)
      return HttpServerResponse.stream(
        Stream.concat(Stream.make(encoder.encode(partial)), Stream.fromEffect(cutConnection(request))),
        { contentType: "application/json" }
      )
    }
    yield* addTokens(reply.completionTokens)
    return HttpServerResponse.jsonUnsafe(dialect.completion(reply, meta))
  })

  const imageError = (kind: DialectErrorKind, message: string) =>
    HttpServerResponse.jsonUnsafe(OpenAiDialect.errorBody(kind, message), {
      status: OpenAiDialect.errorStatus(kind)
    })

  const generateImage = Effect.fn("ProviderServer.generateImage")(function* (
    request: HttpServerRequest.HttpServerRequest
  ) {
    const json = yield* request.json.pipe(Effect.option)
    if (json._tag === "None") return imageError("invalid_request", "request body is not valid JSON")
    const decoded = yield* decodeImageRequest(json.value).pipe(Effect.result)
    if (decoded._tag === "Failure") return imageError("invalid_request", decoded.failure.message)
    const { model = "", prompt } = decoded.success
    if (!options.modelClasses.includes(model) || !model.startsWith("image-")) {
      return imageError("not_found", `image model '${model}' is not served by ${options.providerId}`)
    }
    const size = decoded.success.size ?? DEFAULT_IMAGE_SIZE
    if ((decoded.success.n ?? 1) !== 1 || !isImageSize(size)) {
      return imageError("invalid_request", "one image per request, of size 256x256, 512x512 or 1024x1024")
    }
    if ((decoded.success.response_format ?? "b64_json") !== "b64_json") {
      return imageError("invalid_request", "only response_format b64_json is served")
    }
    const markers = markersFor(prompt, options.providerId)
    const faults = yield* Ref.get(defaultFaults)
    if (markers.error || faults.alwaysError === true) {
      yield* countFault("error")
      return imageError("server_error", `simulated upstream failure at ${options.providerId}`)
    }
    const slow = markers.slow || faults.alwaysSlow === true
    if (slow) yield* countFault("slow")
    yield* Effect.sleep(options.ttftMs * (slow ? slowFactor : 1))
    const png = renderPrompt(prompt, size)
    yield* update((c) => ({ ...c, imagesRendered: c.imagesRendered + 1 }))
    return HttpServerResponse.jsonUnsafe({
      created: Math.floor((yield* Clock.currentTimeMillis) / 1000),
      data: [{ b64_json: png.toString("base64"), revised_prompt: prompt }]
    } satisfies ImagesResponse)
  })

  const router = yield* HttpRouter.make
  yield* router.add("POST", dialect.path, complete)
  yield* router.add("POST", "/v1/images/generations", generateImage)
  const routed = router.asHttpEffect()
  const app = Effect.gen(function* () {
    const request = yield* HttpServerRequest.HttpServerRequest
    const path = request.url.split("?")[0] ?? request.url
    yield* update((c) => ({ ...c, requests: { ...c.requests, [path]: (c.requests[path] ?? 0) + 1 } }))
    return yield* routed
  })

  const server = yield* NodeHttpServer.make(() => createServer(), {
    port: 0,
    host: "127.0.0.1",
    gracefulShutdownTimeout: 1000
  })
  yield* server.serve(app)
  const port = server.address._tag !== "UnixPathAddress" ? server.address.port : 0

  return {
    providerId: options.providerId,
    dialect: options.dialect,
    modelClasses: options.modelClasses,
    baseUrl: `http://127.0.0.1:${port}`,
    counters: Ref.get(counters),
    setFaults: (faults) => Ref.set(defaultFaults, faults)
  }
})

/** A single provider server as a service, for tests that need one upstream. */
export class ProviderServer extends Context.Service<ProviderServer, ProviderServerHandle>()(
  "devnet/fleet/ProviderServer"
) {
  static readonly make = make
  static readonly layer = (options: ProviderServerOptions) => Layer.effect(ProviderServer, make(options))
}
