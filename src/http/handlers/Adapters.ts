import { Effect, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
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
import type { ServeSummary } from "../../inference/Completions.ts"
import { LiveStreams } from "../../inference/LiveStreams.ts"
import { estimatePromptTokens } from "../../inference/Tokens.ts"
import { Api } from "../Api.ts"
import { type Original, PaidCalls } from "../PaidCall.ts"

/**
 * `/v1/responses` and `/v1/messages`: decode the harness's dialect, translate it to the chat
 * request, and enter the one paid lifecycle (`Completions.admit`) exactly as chat completions
 * do — same headers, same idempotency — then encode the served events back into the dialect.
 */

const servedBy = (summary: ServeSummary) => ({
  providerId: summary.providerId,
  modelClass: summary.modelClass
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
    const paidCalls = yield* PaidCalls

    const encodeOptions = ({ admitted, payload }: Original<ResponsesRequest>): ResponsesEncodeOptions => ({
      requestId: admitted.requestId,
      createdAt: admitted.createdAt,
      model: admitted.auction.winner.model_class,
      showReasoning: responsesShowsReasoning(payload),
      echo: responsesEcho(payload),
      svcCleared: { type: "auction_cleared", ...svcEnvelope(admitted) },
      svcFinal: (summary) => svcEnvelope(admitted, servedBy(summary))
    })

    const respond = (original: Original<ResponsesRequest>, from: number) =>
      Effect.gen(function* () {
        const { admitted, agent, payload } = original
        const headers = paidHeaders(admitted, agent, chain.network)
        const options = encodeOptions(original)
        if (payload.stream === true || from > 0) {
          const body = Stream.suspend(() => {
            // The dialect's encoder is stateful: a reconnect replays it from the start and
            // sends only what follows the last event the client saw.
            const encoder = makeResponsesEncoder(options)
            const opening = encoder.start()
            return Stream.concat(
              Stream.fromIterable(from === 0 ? opening : []),
              live.follow(admitted.stream, 0).pipe(
                Stream.map(({ event, index }) => {
                  const frames = encoder.push(event)
                  return index >= from ? frames : []
                }),
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
      return yield* paidCalls.serve({
        path: "/v1/responses",
        dialect: "responses",
        payload,
        chat,
        request,
        respond
      })
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
    const paidCalls = yield* PaidCalls

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

    const respond = (original: Original<MessagesRequest>, from: number) =>
      Effect.gen(function* () {
        const { admitted, agent, payload } = original
        // The Anthropic SDK reads `request-id` as the message's request id.
        const headers = { ...paidHeaders(admitted, agent, chain.network), "request-id": admitted.requestId }
        const options = encodeOptions(original)
        if (payload.stream === true || from > 0) {
          const body = Stream.suspend(() => {
            // The dialect's encoder is stateful: a reconnect replays it from the start and
            // sends only what follows the last event the client saw.
            const encoder = makeMessagesEncoder(options)
            const opening = encoder.start()
            return Stream.concat(
              Stream.fromIterable(from === 0 ? opening : []),
              live.follow(admitted.stream, 0).pipe(
                Stream.map(({ event, index }) => {
                  const frames = encoder.push(event)
                  return index >= from ? frames : []
                }),
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
      return yield* paidCalls.serve({
        path: "/v1/messages",
        dialect: "anthropic",
        payload,
        chat,
        request,
        respond
      })
    })

    return handlers
      .handle("createMessage", ({ payload, request }) => createMessage(payload, request))
      .handle("countTokens", ({ payload }) => Effect.fromResult(countMessagesTokens(payload)))
  })
)
