import { Schema } from "effect"

/** The evaluation wire (spec 4.3 `/v1/evals/*`; docs/decisions.md D146–D149). */

export const EvalSuite = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("eval.suite"),
  cases: Schema.Array(
    Schema.Struct({
      id: Schema.String,
      dialect: Schema.Literals(["openai", "anthropic", "responses"]),
      exercises: Schema.String
    })
  )
})

export const EvalSuiteList = Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(EvalSuite) })

export const CreateEvalRun = Schema.Struct({
  suite: Schema.String,
  /** A model class or routing profile (`auto`, `cheapest`, `fastest`, `best`). */
  target: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128)),
  /** The most the whole run may spend, in base units. */
  budget: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1), Schema.isLessThanOrEqualTo(10 ** 15))
})

export const EvalCaseResult = Schema.Struct({
  case_id: Schema.String,
  dialect: Schema.String,
  passed: Schema.Boolean,
  /** `served`, or the refusal's code. */
  outcome: Schema.String,
  request_id: Schema.NullOr(Schema.String),
  charged: Schema.Int,
  latency_ms: Schema.Int,
  detail: Schema.String
})

export const EvalRun = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("eval.run"),
  suite: Schema.String,
  target: Schema.String,
  wallet: Schema.String,
  status: Schema.Literals(["running", "completed", "failed"]),
  budget: Schema.Int,
  spent: Schema.Int,
  created_at: Schema.Int,
  finished_at: Schema.NullOr(Schema.Int),
  passed: Schema.Int,
  failed: Schema.Int,
  cases: Schema.Array(EvalCaseResult)
})
export type EvalRun = typeof EvalRun.Type

export const OptimizeRequest = Schema.Struct({
  /** Tasks of the calling key to learn from (default: all of them). */
  task_ids: Schema.optionalKey(Schema.Array(Schema.String).check(Schema.isMaxLength(100)))
})

export const ContextRecommendation = Schema.Struct({
  object: Schema.Literal("context.recommendation"),
  /** Always false: a recommendation is advice for the caller's next runs; no live turn changes. */
  applied: Schema.Literal(false),
  tasks: Schema.Int,
  observed_calls: Schema.Int,
  prompt_tokens: Schema.Struct({ p50: Schema.Int, p90: Schema.Int, max: Schema.Int }),
  completion_tokens: Schema.Struct({ p50: Schema.Int, p90: Schema.Int, max: Schema.Int }),
  recommended: Schema.NullOr(
    Schema.Struct({
      /** Keep prompts within this many tokens (summarize or drop older context beyond it). */
      max_prompt_tokens: Schema.Int,
      /** Ask for at most this many output tokens: the worst case held per call shrinks with it. */
      max_tokens: Schema.Int
    })
  ),
  rationale: Schema.String
})
export type ContextRecommendation = typeof ContextRecommendation.Type
