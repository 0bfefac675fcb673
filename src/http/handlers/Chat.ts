import { Effect, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import {
  assemble,
  auctionClearedFrame,
  chatChunkFrames,
  chatCompletionBody,
  paidHeaders
} from "../../inference/ChatEncoding.ts"
import { LiveStreams } from "../../inference/LiveStreams.ts"
import { Api } from "../Api.ts"
import { type Original, PaidCalls } from "../PaidCall.ts"

export const ChatHandlers = HttpApiBuilder.group(
  Api,
  "chat",
  Effect.fn(function* (handlers) {
    const paidCalls = yield* PaidCalls
    const live = yield* LiveStreams
    const chain = yield* Chain

    /** SSE from event `from` on; a fresh read starts with the `auction_cleared` chunk. */
    const respond = ({ admitted, agent, payload }: Original<ChatCompletionRequest>, from: number) =>
      Effect.gen(function* () {
        const includeReasoning = payload.include_reasoning === true
        const headers = paidHeaders(admitted, agent, chain.network)
        if (payload.stream === true || from > 0) {
          const body = live.follow(admitted.stream, from).pipe(
            Stream.map((indexed) => chatChunkFrames(admitted, indexed, includeReasoning)),
            Stream.filter((text) => text.length > 0)
          )
          return HttpServerResponse.stream(
            (from === 0 ? Stream.concat(Stream.make(auctionClearedFrame(admitted)), body) : body).pipe(
              Stream.encodeText
            ),
            { contentType: "text/event-stream", headers: { ...headers, "cache-control": "no-cache" } }
          )
        }
        const events = yield* Stream.runCollect(live.follow(admitted.stream, 0))
        return HttpServerResponse.jsonUnsafe(
          chatCompletionBody(admitted, assemble(events.map((e) => e.event)), includeReasoning),
          { headers }
        )
      })

    const lastEventId = (header: string | undefined) => {
      const id = Number(header)
      return header !== undefined && Number.isInteger(id) && id >= 0 ? id : undefined
    }

    return handlers
      .handle("chatCompletions", ({ payload, request }) =>
        paidCalls.serve({
          path: "/v1/chat/completions",
          dialect: "openai",
          payload,
          chat: payload,
          request,
          respond
        })
      )
      .handle("resumeStream", ({ params, request }) =>
        paidCalls.resume(
          params.id,
          request.headers["x-stream-token"],
          lastEventId(request.headers["last-event-id"])
        )
      )
      .handle("stopStream", ({ params, request }) =>
        Effect.as(paidCalls.stop(params.id, request.headers["x-stream-token"]), {
          id: params.id,
          stopped: true
        })
      )
  })
)
