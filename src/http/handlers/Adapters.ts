import { Effect } from "effect"
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
import type { ServeEvent } from "../../inference/Paid.ts"
import { estimatePromptTokens } from "../../inference/Tokens.ts"
import { traced } from "../../Telemetry.ts"
import { Api } from "../Api.ts"
import { type Original, PaidCalls } from "../PaidCall.ts"
import type { FrameEncoder, Reply } from "../Replies.ts"
import { leanGroup } from "./LeanGroup.ts"

/**
 * `/v1/responses` and `/v1/messages`: decode the harness's dialect, translate it to the chat
 * request, and enter the one paid lifecycle (`Pipeline.admit`) exactly as chat completions
 * do — same headers, same idempotency — then encode the served events back into the dialect.
 */

/** A stateful dialect's SSE encoder as the reply's frame encoder (its frames written as SSE text). */
const framesOf =
  <Frame>(
    make: () => { start(): ReadonlyArray<Frame>; push(event: ServeEvent): ReadonlyArray<Frame> },
    frame: (frame: Frame) => string
  ) =>
  (): FrameEncoder => {
    const encoder = make()
    return {
      start: () => encoder.start().map(frame),
      push: (event) => encoder.push(event).map(frame)
    }
  }

export const ResponsesHandlers = leanGroup(
  Effect.gen(function* () {
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

    const reply = (original: Original<ResponsesRequest>): Reply => {
      const options = encodeOptions(original)
      return {
        stream: original.admitted.stream,
        streaming: original.payload.stream === true,
        headers: paidHeaders(original.admitted, original.agent, chain.network),
        encoder: framesOf(() => makeResponsesEncoder(options), responsesSseFrame),
        body: (events) => responsesBody(options, events)
      }
    }

    const createResponse = Effect.fnUntraced(function* (
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
        reply
      })
    }, traced("Adapters.responses"))

    return HttpApiBuilder.group(Api, "responses", (handlers) =>
      handlers.handle("createResponse", ({ payload, request }) => createResponse(payload, request))
    )
  })
)

export const MessagesHandlers = leanGroup(
  Effect.gen(function* () {
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

    const reply = (original: Original<MessagesRequest>): Reply => {
      const options = encodeOptions(original)
      return {
        stream: original.admitted.stream,
        streaming: original.payload.stream === true,
        // The Anthropic SDK reads `request-id` as the message's request id.
        headers: {
          ...paidHeaders(original.admitted, original.agent, chain.network),
          "request-id": original.admitted.requestId
        },
        encoder: framesOf(() => makeMessagesEncoder(options), messagesSseFrame),
        body: (events) => messagesBody(options, events)
      }
    }

    const createMessage = Effect.fnUntraced(function* (payload: MessagesRequest, request: HttpServerRequest) {
      const chat = yield* Effect.fromResult(messagesToChatRequest(payload))
      return yield* paidCalls.serve({
        path: "/v1/messages",
        dialect: "anthropic",
        payload,
        chat,
        request,
        reply
      })
    }, traced("Adapters.messages"))

    return HttpApiBuilder.group(Api, "messages", (handlers) =>
      handlers
        .handle("createMessage", ({ payload, request }) => createMessage(payload, request))
        .handle("countTokens", ({ payload }) => Effect.fromResult(countMessagesTokens(payload)))
    )
  })
)
