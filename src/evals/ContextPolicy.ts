import type { ContextRecommendation } from "../domain/Evals.ts"

export interface ObservedCall {
  readonly promptTokens: number
  readonly completionTokens: number
}

/** The q-quantile (nearest rank) of non-empty sorted values. */
const quantile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!

const roundUp = (value: number, step: number) => Math.max(step, Math.ceil(value / step) * step)

/**
 * A context policy tuned offline from a task's redacted trace (token counts only; D149): prompts
 * beyond the 90th percentile are the ones to summarize, and `max_tokens` at the 90th percentile of
 * what was produced (with a quarter's headroom) bounds the worst case each call holds. Pure.
 */
export const recommend = (tasks: number, calls: ReadonlyArray<ObservedCall>): ContextRecommendation => {
  const prompts = calls.map((c) => c.promptTokens).sort((a, b) => a - b)
  const completions = calls.map((c) => c.completionTokens).sort((a, b) => a - b)
  const stats = (sorted: ReadonlyArray<number>) =>
    sorted.length === 0
      ? { p50: 0, p90: 0, max: 0 }
      : { p50: quantile(sorted, 0.5), p90: quantile(sorted, 0.9), max: sorted[sorted.length - 1]! }
  const prompt = stats(prompts)
  const completion = stats(completions)
  return {
    object: "context.recommendation",
    applied: false,
    tasks,
    observed_calls: calls.length,
    prompt_tokens: prompt,
    completion_tokens: completion,
    recommended:
      calls.length === 0
        ? null
        : {
            max_prompt_tokens: roundUp(prompt.p90, 1024),
            max_tokens: roundUp(Math.ceil(completion.p90 * 1.25), 64)
          },
    rationale:
      calls.length === 0
        ? "no settled paid calls in these tasks yet"
        : `from ${calls.length} settled calls: prompts above the 90th percentile (${prompt.p90} tokens) are the ones to summarize; 90% of replies used at most ${completion.p90} tokens`
  }
}
