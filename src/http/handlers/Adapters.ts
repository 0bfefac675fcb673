import { Effect, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import type { MessagesRequest } from "../../domain/Messages.ts"
import type { ResponsesRequest } from "../../domain/Responses.ts"
import { countMessagesTokens } from "../../inference/adapters/CountTokens.ts"
import {
  type MessagesEncodeOptions,
  makeMessagesEncoder,
  messagesBody,
  messagesSseFrame
} from "../../inference/adapters/MessagesEncoding.ts"
import { messagesShowsThinking, messagesToChatRequest } from "../../inference/adapters/MessagesRequest.ts"
import {
  makeResponsesEncoder,
  type ResponsesEncodeOptions,
  responsesBody,
  responsesEcho,
  responsesSseFrame
} from "../../inference/adapters/ResponsesEncoding.ts"
import { responsesShowsReasoning, responsesToChatRequest } from "../../inference/adapters/ResponsesRequest.ts"
import { paidHeaders, servedSvc, svcEnvelope } from "../../inference/ChatEncoding.ts"
import { type LiveStream, LiveStreams } from "../../inference/LiveStreams.ts"
import type { ServeEvent } from "../../inference/Paid.ts"
import { estimatePromptTokens } from "../../inference/Tokens.ts"
import { Api } from "../Api.ts"
import { type Original, PaidCalls } from "../PaidCall.ts"

/**
 * `/v1/responses` and `/v1/messages`: decode the harness's dialect, translate it to the chat
 * request, and enter the one paid lifecycle (`Pipeline.admit`) exactly as chat completions
 * do — same headers, same idempotency — then encode the served events back into the dialect.
 */

const sseResponse = (body: Stream.Stream<string>, headers: Record<string, string>) =>
  HttpServerResponse.stream(body.pipe(Stream.encodeText), {
    contentType: "text/event-stream",
    headers: { ...headers, "cache-control": "no-cache" }
  })

/** What a stateful dialect encoder needs: opening frames, frames per served event, and the final body. */
interface DialectEncoding<Options, Frame> {
  readonly make: (options: Options) => {
    start(): ReadonlyArray<Frame>
    push(event: ServeEvent): ReadonlyArray<Frame>
  }
  readonly frame: (frame: Frame) => string
  readonly body: (options: Options, events: ReadonlyArray<ServeEvent>) => unknown
}

/**
 * Streams a served request in a stateful dialect (from event `from` on), or answers its final
 * body. On a reconnect the encoder replays from the start and sends only what follows the last
 * event the client saw.
 */
const respondIn = <Options, Frame>(
  live: LiveStreams["Service"],
  encoding: DialectEncoding<Options, Frame>,
  options: Options,
  stream: LiveStream<ServeEvent>,
  streaming: boolean,
  from: number,
  headers: Record<string, string>
) =>
  Effect.gen(function* () {
    if (streaming || from > 0) {
      const body = Stream.suspend(() => {
        const encoder = encoding.make(options)
        const opening = encoder.start()
        return Stream.concat(
          Stream.fromIterable(from === 0 ? opening : []),
          live.follow(stream, 0).pipe(
            Stream.map(({ event, index }) => {
              const frames = encoder.push(event)
              return index >= from ? frames : []
            }),
            Stream.flattenIterable
          )
        )
      })
      return sseResponse(Stream.map(body, encoding.frame), headers)
    }
    const events = yield* Stream.runCollect(live.follow(stream, 0))
    return HttpServerResponse.jsonUnsafe(
      encoding.body(
        options,
        events.map((e) => e.event)
      ),
      { headers }
    )
  })

const responsesEncoding: DialectEncoding<ResponsesEncodeOptions, Parameters<typeof responsesSseFrame>[0]> = {
  make: makeResponsesEncoder,
  frame: responsesSseFrame,
  body: responsesBody
}

const messagesEncoding: DialectEncoding<MessagesEncodeOptions, Parameters<typeof messagesSseFrame>[0]> = {
  make: makeMessagesEncoder,
  frame: messagesSseFrame,
  body: messagesBody
}

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
      svcFinal: (summary) => servedSvc(admitted, summary)
    })

    const respond = (original: Original<ResponsesRequest>, from: number) =>
      respondIn(
        live,
        responsesEncoding,
        encodeOptions(original),
        original.admitted.stream,
        original.payload.stream === true,
        from,
        paidHeaders(original.admitted, original.agent, chain.network)
      )

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
        ...servedSvc(admitted, summary),
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
      respondIn(
        live,
        messagesEncoding,
        encodeOptions(original),
        original.admitted.stream,
        original.payload.stream === true,
        from,
        // The Anthropic SDK reads `request-id` as the message's request id.
        {
          ...paidHeaders(original.admitted, original.agent, chain.network),
          "request-id": original.admitted.requestId
        }
      )

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
