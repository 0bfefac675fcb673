import { Effect, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import { Conflict } from "../../domain/Errors.ts"
import { countMessagesTokens } from "../../inference/adapters/CountTokens.ts"
import {
  type MessagesEncodeOptions,
  makeMessagesEncoder,
  messagesBody,
  messagesSseFrame
} from "../../inference/adapters/MessagesEncoding.ts"
import {
  type MessagesRequest,
  messagesShowsThinking,
  messagesToChatRequest
} from "../../inference/adapters/MessagesRequest.ts"
import {
  makeResponsesEncoder,
  type ResponsesEncodeOptions,
  responsesBody,
  responsesEcho,
  responsesSseFrame
} from "../../inference/adapters/ResponsesEncoding.ts"
import {
  type ResponsesRequest,
  responsesShowsReasoning,
  responsesToChatRequest
} from "../../inference/adapters/ResponsesRequest.ts"
import { paidHeaders, svcEnvelope } from "../../inference/ChatEncoding.ts"
import {
  type Admitted,
  type AgentHeaders,
  Completions,
  type PaidRequestContext,
  type ServeEvent,
  type ServeSummary
} from "../../inference/Completions.ts"
import { type LiveStream, LiveStreams } from "../../inference/LiveStreams.ts"
import { estimatePromptTokens } from "../../inference/Tokens.ts"
import { bodyHash, Idempotency } from "../../payment/Idempotency.ts"
import { RouterConfig } from "../../RouterConfig.ts"
import { Api } from "../Api.ts"
import { agentHeadersOf, paymentHeaderOf } from "./Chat.ts"

/**
 * `/v1/responses` and `/v1/messages`: decode the harness's dialect, translate it to the chat
 * request, and enter the one paid lifecycle (`Completions.admit`) exactly as chat completions
 * do — same headers, same idempotency — then encode the served events back into the dialect.
 */

interface Original<P> {
  readonly admitted: Admitted
  readonly agent: AgentHeaders
  readonly payload: P
}

const servedBy = (summary: ServeSummary) => ({
  providerId: summary.providerId,
  modelClass: summary.modelClass
})

/** The paid-call plumbing both adapters share: idempotency, the admit, and what a replay needs. */
const makePaidCall = Effect.gen(function* () {
  const completions = yield* Completions
  const live = yield* LiveStreams
  const idempotency = yield* Idempotency
  const config = yield* RouterConfig

  return <P>(options: {
    readonly path: string
    readonly dialect: PaidRequestContext["dialect"]
    readonly payload: P
    readonly chat: ChatCompletionRequest
    readonly request: HttpServerRequest
    readonly originals: WeakMap<LiveStream<ServeEvent>, Original<P>>
  }) =>
    Effect.gen(function* () {
      const { request, originals } = options
      const agent = agentHeadersOf(request)
      const key = request.headers["idempotency-key"]
      if (key !== undefined) {
        const claim = yield* idempotency.claim(key, bodyHash({ path: options.path, body: options.payload }))
        if (claim._tag === "Replay") {
          const stream = live.get<ServeEvent>(claim.requestId)
          const original = stream === undefined ? undefined : originals.get(stream)
          if (original === undefined) {
            return yield* new Conflict({
              code: "idempotency_replay",
              param: "Idempotency-Key",
              message: `This Idempotency-Key already produced request ${claim.requestId}; read its result at /v1/receipts/${claim.requestId}`
            })
          }
          return original
        }
      }
      const admitted = yield* completions
        .admit(options.chat, {
          dialect: options.dialect,
          paymentHeader: paymentHeaderOf(request),
          creditKey: request.headers["x-credit-key"],
          sessionToken: request.headers["x-session-token"],
          resourceUrl: `${config.publicUrl}${options.path}`,
          agent
        })
        .pipe(Effect.tapError(() => (key === undefined ? Effect.void : idempotency.abandon(key))))
      const original = { admitted, agent, payload: options.payload }
      originals.set(admitted.stream, original)
      if (key !== undefined) yield* idempotency.complete(key, admitted.requestId)
      return original
    })
})

const sseResponse = (body: Stream.Stream<string>, headers: Record<string, string>) =>
  HttpServerResponse.stream(body.pipe(Stream.encodeText), {
    contentType: "text/event-stream",
    headers: { ...headers, "cache-control": "no-cache" }
  })

export const ResponsesHandlers = HttpApiBuilder.group(
  Api,
  "responses",
  Effect.fn(function* (handlers) {
    const live = yield* LiveStreams
    const chain = yield* Chain
    const paidCall = yield* makePaidCall
    const originals = new WeakMap<LiveStream<ServeEvent>, Original<ResponsesRequest>>()

    const encodeOptions = ({ admitted, payload }: Original<ResponsesRequest>): ResponsesEncodeOptions => ({
      requestId: admitted.requestId,
      createdAt: admitted.createdAt,
      model: admitted.auction.winner.model_class,
      showReasoning: responsesShowsReasoning(payload),
      echo: responsesEcho(payload),
      svcCleared: { type: "auction_cleared", ...svcEnvelope(admitted) },
      svcFinal: (summary) => svcEnvelope(admitted, servedBy(summary))
    })

    const respond = (original: Original<ResponsesRequest>) =>
      Effect.gen(function* () {
        const { admitted, agent, payload } = original
        const headers = paidHeaders(admitted, agent, chain.network)
        const options = encodeOptions(original)
        if (payload.stream === true) {
          const body = Stream.suspend(() => {
            const encoder = makeResponsesEncoder(options)
            return Stream.concat(
              Stream.fromIterable(encoder.start()),
              live.follow(admitted.stream, 0).pipe(
                Stream.map(({ event }) => encoder.push(event)),
                Stream.flattenIterable
              )
            )
          })
          return sseResponse(Stream.map(body, responsesSseFrame), headers)
        }
        const events = yield* Stream.runCollect(live.follow(admitted.stream, 0))
        return HttpServerResponse.jsonUnsafe(
          responsesBody(
            options,
            events.map((e) => e.event)
          ),
          { headers }
        )
      })

    const createResponse = Effect.fn("Adapters.responses")(function* (
      payload: ResponsesRequest,
      request: HttpServerRequest
    ) {
      const chat = yield* Effect.fromResult(responsesToChatRequest(payload))
      const original = yield* paidCall({
        path: "/v1/responses",
        dialect: "responses",
        payload,
        chat,
        request,
        originals
      })
      return yield* respond(original)
    })

    return handlers.handle("createResponse", ({ payload, request }) => createResponse(payload, request))
  })
)

export const MessagesHandlers = HttpApiBuilder.group(
  Api,
  "messages",
  Effect.fn(function* (handlers) {
    const live = yield* LiveStreams
    const chain = yield* Chain
    const paidCall = yield* makePaidCall
    const originals = new WeakMap<LiveStream<ServeEvent>, Original<MessagesRequest>>()

    const encodeOptions = ({ admitted, payload }: Original<MessagesRequest>): MessagesEncodeOptions => ({
      requestId: admitted.requestId,
      model: admitted.auction.winner.model_class,
      showThinking: messagesShowsThinking(payload),
      inputTokensEstimate: estimatePromptTokens(admitted.request.messages),
      svcCleared: { type: "auction_cleared", ...svcEnvelope(admitted) },
      svcFinal: (summary) => ({
        ...svcEnvelope(admitted, servedBy(summary)),
        charged: summary.charged,
        authorized: summary.authorized
      }),
      svcUsage: (summary) => ({
        type: "usage",
        request_id: admitted.requestId,
        status: summary.status,
        charged: summary.charged,
        authorized: summary.authorized
      })
    })

    const respond = (original: Original<MessagesRequest>) =>
      Effect.gen(function* () {
        const { admitted, agent, payload } = original
        // The Anthropic SDK reads `request-id` as the message's request id.
        const headers = { ...paidHeaders(admitted, agent, chain.network), "request-id": admitted.requestId }
        const options = encodeOptions(original)
        if (payload.stream === true) {
          const body = Stream.suspend(() => {
            const encoder = makeMessagesEncoder(options)
            return Stream.concat(
              Stream.fromIterable(encoder.start()),
              live.follow(admitted.stream, 0).pipe(
                Stream.map(({ event }) => encoder.push(event)),
                Stream.flattenIterable
              )
            )
          })
          return sseResponse(Stream.map(body, messagesSseFrame), headers)
        }
        const events = yield* Stream.runCollect(live.follow(admitted.stream, 0))
        return HttpServerResponse.jsonUnsafe(
          messagesBody(
            options,
            events.map((e) => e.event)
          ),
          { headers }
        )
      })

    const createMessage = Effect.fn("Adapters.messages")(function* (
      payload: MessagesRequest,
      request: HttpServerRequest
    ) {
      const chat = yield* Effect.fromResult(messagesToChatRequest(payload))
      const original = yield* paidCall({
        path: "/v1/messages",
        dialect: "anthropic",
        payload,
        chat,
        request,
        originals
      })
      return yield* respond(original)
    })

    return handlers
      .handle("createMessage", ({ payload, request }) => createMessage(payload, request))
      .handle("countTokens", ({ payload }) => Effect.fromResult(countMessagesTokens(payload)))
  })
)
