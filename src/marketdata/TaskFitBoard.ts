import { Context, Effect, Layer, Schedule, Semaphore } from "effect"
import { SqlClient } from "effect/sql"
import { type TaskEvidence, TaskFitEvidence, taskFitOf } from "../market/TaskFit.ts"

/** How often the board re-reads the ratings (those other instances recorded reach routing by then). */
export const TASK_FIT_RELOAD_MS = 5_000

/** One (class, task) row of the evidence. */
export interface TaskFitRow {
  readonly modelClass: string
  readonly task: string
  readonly ratings: number
  /** Sum of the ratings (1..5 each): the mean is exact from it. */
  readonly sum: number
}

/**
 * The task-fit evidence in memory (docs/decisions.md D232): the count and sum of ratings per (task,
 * class) from `market_feedback`, re-read every 5 s and at once after this instance records a rating
 * (reads one at a time, so the one after a rating sees it). The RFQ reads it through the market's
 * `TaskFitEvidence` (never a query per request); `/v1/analytics/task-fit` shows the same rows.
 */
export class TaskFitBoard extends Context.Service<
  TaskFitBoard,
  {
    /** Every (class, task) with ratings, by task then class. */
    readonly rows: Effect.Effect<ReadonlyArray<TaskFitRow>>
    /** Re-reads the ratings (after one was recorded); done when the board holds it. */
    readonly reload: Effect.Effect<void>
  }
>()("router/marketdata/TaskFitBoard") {
  /** The board and, over it, the market's `TaskFitEvidence`. */
  static readonly layer = Layer.effectContext(
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const oneAtATime = yield* Semaphore.make(1)
      let rows: ReadonlyArray<TaskFitRow> = []
      let byTask = new Map<string, Map<string, TaskEvidence>>()

      const reload = oneAtATime.withPermit(
        Effect.gen(function* () {
          const read = yield* sql<{ model_class: string; task: string; n: string; total: string }>`
            SELECT model_class, task, count(*)::text AS n, sum(rating)::text AS total
            FROM market_feedback GROUP BY model_class, task ORDER BY task, model_class
          `.pipe(Effect.orDie)
          rows = read.map((r) => ({
            modelClass: r.model_class,
            task: r.task,
            ratings: Number(r.n),
            sum: Number(r.total)
          }))
          const next = new Map<string, Map<string, TaskEvidence>>()
          for (const row of rows) {
            let classes = next.get(row.task)
            if (classes === undefined) {
              classes = new Map()
              next.set(row.task, classes)
            }
            classes.set(row.modelClass, { ratings: row.ratings, mean: row.sum / row.ratings })
          }
          byTask = next
        })
      )
      yield* reload
      yield* reload.pipe(
        Effect.catchCause((cause) => Effect.logWarning("task fit: reading the ratings failed", cause)),
        Effect.repeat(Schedule.spaced(TASK_FIT_RELOAD_MS)),
        Effect.forkScoped
      )

      const empty = new Map<string, TaskEvidence>()
      return Context.make(TaskFitBoard, TaskFitBoard.of({ rows: Effect.sync(() => rows), reload })).pipe(
        Context.add(
          TaskFitEvidence,
          TaskFitEvidence.of({
            forTask: (task) => Effect.sync(() => taskFitOf(task, byTask.get(task) ?? empty))
          })
        )
      )
    })
  )
}
