import { Effect, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { Chain } from "../../chain/Chain.ts"
import type { ChatCompletionRequest } from "../../domain/Chat.ts"
import { Conflict, NotFound, Unauthorized } from "../../domain/Errors.ts"
import {
  assemble,
  auctionClearedFrame,
  chatChunkFrames,
  chatCompletionBody,
  paidHeaders
} from "../../inference/ChatEncoding.ts"
import {
  type Admitted,
  type AgentHeaders,
  Completions,
  type ServeEvent
} from "../../inference/Completions.ts"
import { type LiveStream, LiveStreams } from "../../inference/LiveStreams.ts"
import { bodyHash, Idempotency } from "../../payment/Idempotency.ts"
import { RouterConfig } from "../../RouterConfig.ts"
import { Api } from "../Api.ts"

/** The admitted request behind each live stream, for replays and reconnects on this instance. */
const admittedBy = new WeakMap<LiveStream<ServeEvent>, { admitted: Admitted; agent: AgentHeaders }>()

export const agentHeadersOf = (request: HttpServerRequest): AgentHeaders => ({
  role: request.headers["x-routing-agent-role"],
  parentTask: request.headers["x-routing-parent-task"],
  agentId: request.headers["x-routing-agent-id"]
})

export const paymentHeaderOf = (request: HttpServerRequest): string | undefined =>
  request.headers["payment-signature"] ?? request.headers["x-payment"]

export const ChatHandlers = HttpApiBuilder.group(
  Api,
  "chat",
  Effect.fn(function* (handlers) {
    const completions = yield* Completions
    const live = yield* LiveStreams
    const idempotency = yield* Idempotency
    const chain = yield* Chain
    const config = yield* RouterConfig

    const sse = (admitted: Admitted, agent: AgentHeaders, from: number, includeMeta: boolean) => {
      const includeReasoning = admitted.request.include_reasoning === true
      const body = live.follow(admitted.stream, from).pipe(
        Stream.map((indexed) => chatChunkFrames(admitted, indexed, includeReasoning)),
        Stream.filter((text) => text.length > 0)
      )
      return HttpServerResponse.stream(
        (includeMeta ? Stream.concat(Stream.make(auctionClearedFrame(admitted)), body) : body).pipe(
          Stream.encodeText
        ),
        {
          contentType: "text/event-stream",
          headers: { ...paidHeaders(admitted, agent, chain.network), "cache-control": "no-cache" }
        }
      )
    }

    const respond = (admitted: Admitted, agent: AgentHeaders) =>
      Effect.gen(function* () {
        if (admitted.request.stream === true) return sse(admitted, agent, 0, true)
        const events = yield* Stream.runCollect(live.follow(admitted.stream, 0))
        const assembled = assemble(events.map((e) => e.event))
        return HttpServerResponse.jsonUnsafe(
          chatCompletionBody(admitted, assembled, admitted.request.include_reasoning === true),
          { headers: paidHeaders(admitted, agent, chain.network) }
        )
      })

    const replay = (requestId: string) =>
      Effect.gen(function* () {
        const stream = live.get<ServeEvent>(requestId)
        const original = stream === undefined ? undefined : admittedBy.get(stream)
        if (original === undefined) {
          return yield* new Conflict({
            code: "idempotency_replay",
            param: "Idempotency-Key",
            message: `This Idempotency-Key already produced request ${requestId}; read its result at /v1/receipts/${requestId}`
          })
        }
        return yield* respond(original.admitted, original.agent)
      })

    const chatCompletions = Effect.fn("Chat.completions")(function* (
      payload: ChatCompletionRequest,
      request: HttpServerRequest
    ) {
      const agent = agentHeadersOf(request)
      const key = request.headers["idempotency-key"]
      if (key !== undefined) {
        const claim = yield* idempotency.claim(key, bodyHash(payload))
        if (claim._tag === "Replay") return yield* replay(claim.requestId)
      }
      const admitted = yield* completions
        .admit(payload, {
          dialect: "openai",
          paymentHeader: paymentHeaderOf(request),
          creditKey: request.headers["x-credit-key"],
          sessionToken: request.headers["x-session-token"],
          resourceUrl: `${config.publicUrl}/v1/chat/completions`,
          agent
        })
        .pipe(Effect.tapError(() => (key === undefined ? Effect.void : idempotency.abandon(key))))
      admittedBy.set(admitted.stream, { admitted, agent })
      if (key !== undefined) yield* idempotency.complete(key, admitted.requestId)
      return yield* respond(admitted, agent)
    })

    const streamFor = (id: string, request: HttpServerRequest) =>
      Effect.gen(function* () {
        const stream = live.get<ServeEvent>(id)
        const original = stream === undefined ? undefined : admittedBy.get(stream)
        if (stream === undefined || original === undefined) {
          return yield* new NotFound({ code: "stream_not_found", message: `No live or recent stream ${id}` })
        }
        if (!live.verify(stream, request.headers["x-stream-token"])) {
          return yield* new Unauthorized({
            code: "invalid_stream_token",
            message: "Missing or invalid x-stream-token"
          })
        }
        return { stream, ...original }
      })

    return handlers
      .handle("chatCompletions", ({ payload, request }) => chatCompletions(payload, request))
      .handle("resumeStream", ({ params, request }) =>
        Effect.gen(function* () {
          const { admitted, agent } = yield* streamFor(params.id, request)
          const lastEventId = Number(request.headers["last-event-id"] ?? "-1")
          const from = Number.isInteger(lastEventId) ? lastEventId + 1 : 0
          return sse(admitted, agent, from, from === 0)
        })
      )
      .handle("stopStream", ({ params, request }) =>
        Effect.gen(function* () {
          const { stream } = yield* streamFor(params.id, request)
          yield* live.stop(stream)
          return { id: params.id, stopped: true }
        })
      )
  })
)
