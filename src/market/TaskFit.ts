/**
 * Task fit in the auction (docs/auction.md section 4, docs/decisions.md D232): when a request names a
 * task (`routing.task`), the explicit ratings recorded for that task move each class's quality in the
 * score by a bounded amount. The rule is pure; the evidence comes in through `TaskFitEvidence`, a service
 * this floor defines and market data (a floor above) provides, so the market never reads the ratings.
 */
import { Context, type Effect } from "effect"

/** The ratings of one class for one task: how many, and their mean on the 1..5 scale. */
export interface TaskEvidence {
  readonly ratings: number
  readonly mean: number
}

/** What the auction knows about the request's task: its label and the evidence per class. */
export interface TaskFit {
  readonly task: string
  readonly evidence: (modelClass: string) => TaskEvidence | undefined
}

/** Below this many ratings a class's quality is not moved for the task. */
export const TASK_FIT_MIN_RATINGS = 5
/** Ratings weigh `n / (n + prior)` against the catalog's quality: 10 ratings move it halfway. */
export const TASK_FIT_PRIOR_RATINGS = 10
/** The most a task's ratings move a class's quality, either way. */
export const TASK_FIT_MAX_SHIFT = 0.25

const round6 = (x: number) => Math.round(x * 1e6) / 1e6

/** The quality the ratings say, on the catalog's 0..1 scale: 1 → 0, 5 → 1. */
export const ratedQuality = (mean: number): number => Math.min(1, Math.max(0, (mean - 1) / 4))

/**
 * How much a class's quality moves for a task: none below the minimum sample; else the ratings' quality
 * minus the catalog's, weighed by `n / (n + prior)` (so the moved quality stays between the two, in
 * [0, 1]), clamped to ±`TASK_FIT_MAX_SHIFT`, rounded to six decimals.
 */
export const qualityShift = (quality: number, evidence: TaskEvidence | undefined): number => {
  if (evidence === undefined || evidence.ratings < TASK_FIT_MIN_RATINGS) return 0
  const weight = evidence.ratings / (evidence.ratings + TASK_FIT_PRIOR_RATINGS)
  const gap = ratedQuality(evidence.mean) - quality
  return round6(Math.min(TASK_FIT_MAX_SHIFT, Math.max(-TASK_FIT_MAX_SHIFT, weight * gap)))
}

/** The evidence of a set of ratings, for tests and for the board that keeps them. */
export const taskFitOf = (task: string, byClass: ReadonlyMap<string, TaskEvidence>): TaskFit => ({
  task,
  evidence: (modelClass) => byClass.get(modelClass)
})

/**
 * The task-fit evidence the RFQ reads: for a task label, each class's ratings as of now (from memory;
 * never a query per request). Provided by `marketdata/TaskFitBoard.ts`.
 */
export class TaskFitEvidence extends Context.Service<
  TaskFitEvidence,
  { readonly forTask: (task: string) => Effect.Effect<TaskFit> }
>()("router/market/TaskFitEvidence") {}
