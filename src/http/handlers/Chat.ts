import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import { assemble, chatCompletionBody, makeChatEncoder, paidHeaders } from "../../inference/ChatEncoding.ts"
import { Api } from "../Api.ts"
import { type Original, PaidCalls } from "../PaidCall.ts"
import type { Reply } from "../Replies.ts"
import { leanGroup } from "./LeanGroup.ts"

export const ChatHandlers = leanGroup(
  Effect.gen(function* () {
    const paidCalls = yield* PaidCalls
    const chain = yield* Chain

    /** SSE (a fresh read starts with the `auction_cleared` chunk), or the whole completion. */
    const reply = ({ admitted, agent, payload }: Original<ChatCompletionRequest>): Reply => {
      const includeReasoning = payload.include_reasoning === true
      return {
        stream: admitted.stream,
        streaming: payload.stream === true,
        headers: paidHeaders(admitted, agent, chain.network),
        encoder: () => makeChatEncoder(admitted, includeReasoning),
        body: (events) => chatCompletionBody(admitted, assemble(events), includeReasoning)
      }
    }

    const lastEventId = (header: string | undefined) => {
      const id = Number(header)
      return header !== undefined && Number.isInteger(id) && id >= 0 ? id : undefined
    }

    return HttpApiBuilder.group(Api, "chat", (handlers) =>
      handlers
        .handle("chatCompletions", ({ payload, request }) =>
          paidCalls.serve({
            path: "/v1/chat/completions",
            dialect: "openai",
            payload,
            chat: payload,
            request,
            reply
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
    )
  })
)
