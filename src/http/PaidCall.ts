import { createHash } from "node:crypto"
import { Context, Effect, Layer } from "effect"
import type { HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { Chain } from "../chain/Chain.ts"
import type { ChatCompletionRequest } from "../domain/Chat.ts"
import { Conflict, NotFound, Unauthorized } from "../domain/Errors.ts"
import { type LiveStream, LiveStreams } from "../inference/LiveStreams.ts"
import type {
  Admitted,
  AgentHeaders,
  CompletionError,
  PaidRequestContext,
  ServeEvent
} from "../inference/Paid.ts"
import { Pipeline } from "../inference/Pipeline.ts"
import { bodyHash, Idempotency } from "../payment/Idempotency.ts"
import { checkPaymentSignature } from "../payment/PaymentSignature.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { keptReply, keptResponse, type Reply, respondLive, type Writing, writing } from "./Replies.ts"

export interface Original<P> {
  readonly admitted: Admitted
  readonly agent: AgentHeaders
  readonly payload: P
}

/** The served request's reply in its caller's dialect (the handler's part). */
export type ReplyOf<P> = (original: Original<P>) => Reply

export const agentHeadersOf = (request: HttpServerRequest): AgentHeaders => ({
  role: request.headers["x-routing-agent-role"],
  parentTask: request.headers["x-routing-parent-task"],
  agentId: request.headers["x-routing-agent-id"]
})

/** Every credential a paid call may carry, read in one place for all three dialects. */
export const paidContextOf = (
  request: HttpServerRequest,
  dialect: PaidRequestContext["dialect"],
  resourceUrl: string
): PaidRequestContext => ({
  dialect,
  paymentHeader: request.headers["payment-signature"] ?? request.headers["x-payment"],
  creditKey: request.headers["x-credit-key"],
  sessionToken: request.headers["x-session-token"],
  taskToken: request.headers["x-task-token"],
  resourceUrl,
  agent: agentHeadersOf(request)
})

/**
 * The plumbing every paid surface shares: `Idempotency-Key`, the one lifecycle
 * (`Pipeline.admit`), and a registry of what was served on this instance so that an
 * idempotent replay, `GET /v1/streams/:id` and `POST /v1/streams/:id/stop` work the same for
 * chat completions, responses and messages.
 */
export class PaidCalls extends Context.Service<
  PaidCalls,
  {
    readonly serve: <P>(options: {
      readonly path: string
      readonly dialect: PaidRequestContext["dialect"]
      readonly payload: P
      readonly chat: ChatCompletionRequest
      readonly request: HttpServerRequest
      readonly reply: ReplyOf<P>
    }) => Effect.Effect<HttpServerResponse.HttpServerResponse, CompletionError | Conflict>
    /** Reconnects to a stream from the event after `lastEventId` (x-stream-token). */
    readonly resume: (
      id: string,
      token: string | undefined,
      lastEventId: number | undefined
    ) => Effect.Effect<HttpServerResponse.HttpServerResponse, NotFound | Unauthorized>
    readonly stop: (id: string, token: string | undefined) => Effect.Effect<void, NotFound | Unauthorized>
  }
>()("router/http/PaidCalls") {
  static readonly layer = Layer.effect(
    PaidCalls,
    Effect.gen(function* () {
      const pipeline = yield* Pipeline
      const live = yield* LiveStreams
      const idempotency = yield* Idempotency
      const config = yield* RouterConfig
      const chain = yield* Chain
      const sha256 = (value: string) => createHash("sha256").update(value).digest("hex")

      /**
       * Who is paying: a funded key, a session, or the wallet that signed the x402 header. The header's
       * signature is checked here, once: the check goes on with the call (`signed`), and the payment
       * verifier takes its answer instead of checking again.
       */
      const callerScope = (context: PaidRequestContext) =>
        Effect.gen(function* () {
          if (context.creditKey !== undefined) return { scope: `key:${sha256(context.creditKey)}`, context }
          if (context.sessionToken !== undefined) {
            return { scope: `session:${sha256(context.sessionToken)}`, context }
          }
          if (context.paymentHeader === undefined) return { scope: undefined, context }
          const signed = yield* checkPaymentSignature(chain, context.paymentHeader)
          const checked = { ...context, signed }
          return signed?.valid === true
            ? { scope: `payer:${signed.payer.toLowerCase()}`, context: checked }
            : { scope: undefined, context: checked }
        })

      /**
       * A served stream's reply from event `from` on: its kept bytes once it finished, else written live.
       * The reply (which holds the call's record: the parsed request, the auction) is reachable only from
       * the stream's keeper and the response being written, so it goes when the stream finishes (D270).
       */
      const replay = (stream: LiveStream<ServeEvent>, from: number) =>
        Effect.suspend(() => {
          if (stream.kept !== undefined) return Effect.succeed(keptResponse(stream.kept, from))
          const written = replies.get(stream)
          return written === undefined ? Effect.succeed(undefined) : respondLive(live, written, from)
        })
      const replies = new WeakMap<LiveStream<ServeEvent>, Writing>()
      /**
       * What the stream keeps when it finishes, made here, not in the request's step: a closure made
       * there would keep that step's context (the call's credentials among it) for the reply's life (D502).
       */
      const keeperOf =
        (stream: LiveStream<ServeEvent>, written: Writing) => (events: ReadonlyArray<ServeEvent>) => {
          replies.delete(stream)
          return keptReply(written, events)
        }

      type ServeOptions<P> = {
        readonly path: string
        readonly dialect: PaidRequestContext["dialect"]
        readonly payload: P
        readonly chat: ChatCompletionRequest
        readonly request: HttpServerRequest
        readonly reply: ReplyOf<P>
      }

      /**
       * Admission is uninterruptible but for the wait for an admission permit (D531, before anything is
       * taken) and the wait for the first token; once it returns, the key (if
       * any) is completed with its request id in the same step, so a hang-up either frees the key
       * (nothing was served) or leaves it pointing at the request that answered it.
       */
      const admitAndRespond = <P>(options: ServeOptions<P>, context: PaidRequestContext, key?: string) =>
        Effect.gen(function* () {
          const admitted = yield* Effect.uninterruptibleMask((restore) =>
            key === undefined
              ? restore(pipeline.admit(options.chat, context))
              : restore(pipeline.admit(options.chat, context)).pipe(
                  Effect.tap((admitted) => idempotency.complete(key, admitted.requestId))
                )
          )
          const written = writing(options.reply({ admitted, agent: context.agent, payload: options.payload }))
          replies.set(admitted.stream, written)
          live.keep(admitted.stream, keeperOf(admitted.stream, written))
          return yield* respondLive(live, written, 0)
        })

      /** A call with an `Idempotency-Key`: claimed (in a scope of its own, released once answered) or replayed. */
      const idempotent = <P>(options: ServeOptions<P>, sent: PaidRequestContext, idempotencyKey: string) =>
        Effect.gen(function* () {
          const { scope, context } = yield* callerScope(sent)
          // A key is the caller's own: scoped to the credential that pays, so nobody else can
          // replay someone's reply (or the tokens that came with it). An unpaid call has no scope.
          if (scope === undefined) return yield* admitAndRespond(options, context)
          const key = createHash("sha256").update(`${scope}\n${idempotencyKey}`).digest("hex")
          const claim = yield* idempotency.claim(key, bodyHash({ path: options.path, body: options.payload }))
          if (claim._tag === "Replay") {
            const stream = live.get<ServeEvent>(claim.requestId)
            const replayed = stream === undefined ? undefined : yield* replay(stream, 0)
            if (replayed === undefined) {
              return yield* new Conflict({
                code: "idempotency_replay",
                param: "Idempotency-Key",
                message: `This Idempotency-Key already produced request ${claim.requestId}; read its result at /v1/receipts/${claim.requestId}`
              })
            }
            return replayed
          }
          return yield* admitAndRespond(options, context, key)
        }).pipe(Effect.scoped)

      // Without an Idempotency-Key (the usual call) nothing is scoped: no scope is made per request.
      const serve = <P>(options: ServeOptions<P>) =>
        Effect.suspend(() => {
          const { request } = options
          const context = paidContextOf(request, options.dialect, `${config.publicUrl}${options.path}`)
          const idempotencyKey = request.headers["idempotency-key"]
          return idempotencyKey === undefined
            ? admitAndRespond(options, context)
            : idempotent(options, context, idempotencyKey)
        })

      const notFound = (id: string) =>
        new NotFound({ code: "stream_not_found", message: `No live or recent stream ${id}` })

      const find = (id: string, token: string | undefined) =>
        Effect.gen(function* () {
          const stream = live.get<ServeEvent>(id)
          if (stream === undefined || (stream.kept === undefined && !replies.has(stream))) {
            return yield* notFound(id)
          }
          if (!live.verify(stream, token)) {
            return yield* new Unauthorized({
              code: "invalid_stream_token",
              message: "Missing or invalid x-stream-token"
            })
          }
          return stream
        })

      return PaidCalls.of({
        serve,
        resume: (id, token, lastEventId) =>
          Effect.flatMap(find(id, token), (stream) =>
            Effect.flatMap(replay(stream, lastEventId === undefined ? 0 : lastEventId + 1), (response) =>
              response === undefined ? Effect.fail(notFound(id)) : Effect.succeed(response)
            )
          ),
        // A stream that ended has nothing left to stop: its settlement runs on its own (D534), and a stop
        // would wait for it.
        stop: (id, token) =>
          Effect.flatMap(find(id, token), (stream) =>
            stream.finishedAt !== undefined ? Effect.void : live.stop(stream)
          )
      })
    })
  )
}
