import { Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Conflict, NotFound, Unauthorized } from "../domain/Errors.ts"
import type { FeedbackRecorded, FeedbackRequest, TaskFit } from "../domain/MarketData.ts"
import { LiveStreams, SETTLED_WAIT_MS } from "../inference/LiveStreams.ts"
import { TaskFitBoard } from "./TaskFitBoard.ts"

/** The task label of a rating that names none. */
export const GENERAL_TASK = "general"

/**
 * Routing feedback (spec 4.1, docs/decisions.md D129): one explicit rating per served request, proven by
 * the request's `x-stream-token` while the serving instance still holds its stream (10 minutes, less under load: D548), and the
 * aggregate evidence per (class, task) at `GET /v1/analytics/task-fit`: the rows of the board that
 * automatic routing reads when a request names a task (D232), re-read at once after a rating.
 */
export class Feedback extends Context.Service<
  Feedback,
  {
    readonly rate: (
      requestId: string,
      token: string | undefined,
      rating: FeedbackRequest
    ) => Effect.Effect<FeedbackRecorded, NotFound | Unauthorized | Conflict>
    readonly taskFit: Effect.Effect<TaskFit>
  }
>()("router/marketdata/Feedback") {
  static readonly layer = Layer.effect(
    Feedback,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const live = yield* LiveStreams
      const board = yield* TaskFitBoard

      const rate = Effect.fn("Feedback.rate")(function* (
        requestId: string,
        token: string | undefined,
        rating: FeedbackRequest
      ) {
        const stream = live.get(requestId)
        if (stream === undefined) {
          return yield* new NotFound({
            code: "request_not_found",
            message: `No served request ${requestId} to rate here (ratings are taken while the instance that served it holds its stream: up to 10 minutes)`
          })
        }
        if (!live.verify(stream, token)) {
          return yield* new Unauthorized({
            code: "invalid_stream_token",
            message: "Missing or invalid x-stream-token"
          })
        }
        // The reply can precede the settlement that writes the clear (D534).
        yield* live.awaitDone(requestId, SETTLED_WAIT_MS)
        const cleared = yield* sql<{ model_class: string; provider_id: string }>`
          SELECT model_class, provider_id FROM market_clears WHERE request_id = ${requestId}
        `.pipe(Effect.orDie)
        const clear = cleared[0]
        if (clear === undefined) {
          return yield* new NotFound({
            code: "request_not_found",
            message: `Request ${requestId} delivered nothing that cleared, so there is nothing to rate`
          })
        }
        const task = rating.task ?? GENERAL_TASK
        const inserted = yield* sql<{ request_id: string }>`
          INSERT INTO market_feedback (request_id, model_class, provider_id, task, rating)
          VALUES (${requestId}, ${clear.model_class}, ${clear.provider_id}, ${task}, ${rating.rating})
          ON CONFLICT (request_id) DO NOTHING RETURNING request_id
        `.pipe(Effect.orDie)
        if (inserted.length === 0) {
          return yield* new Conflict({
            code: "feedback_already_recorded",
            message: `Request ${requestId} is already rated; the first rating stands`
          })
        }
        yield* board.reload
        return {
          object: "routing.feedback" as const,
          request_id: requestId,
          model_class: clear.model_class,
          rating: rating.rating,
          task
        }
      })

      const taskFit = Effect.map(board.rows, (rows) => ({
        object: "analytics.task_fit" as const,
        scale: "ratings 1 (poor) to 5 (excellent), one per served request",
        fits: rows.map((r) => ({
          model_class: r.modelClass,
          task: r.task,
          ratings: r.ratings,
          mean: Math.round((r.sum / r.ratings) * 1000) / 1000
        }))
      })).pipe(Effect.withSpan("Feedback.taskFit"))

      return Feedback.of({ rate, taskFit })
    })
  )
}
