import type { Acceptance } from "../domain/Tasks.ts"
import { violations } from "./JsonSchema.ts"

/** What a verdict is graded on: the task's records as they stand, and the output the caller submits. */
export interface Evidence {
  readonly events: ReadonlyArray<{ readonly type: string; readonly source: "client" | "router" }>
  readonly unresolvedEffects: ReadonlyArray<string>
  readonly budget: number
  readonly spent: number
  readonly held: number
  readonly steps: number
  readonly maxSteps: number
  /** Each approval's latest decision. */
  readonly approvals: ReadonlyMap<string, "granted" | "denied">
  /** Paths of the task's latest workspace snapshot. */
  readonly artifacts: ReadonlySet<string>
  readonly output: unknown
}

export interface Check {
  readonly name: string
  readonly passed: boolean
  readonly detail: string
}

/** Event types only the router writes: a client event of one of these names never counts (D139). */
export const routerOnly = (type: string) =>
  /^(task|checkpoint|effect|acceptance|snapshot|verification)\./.test(type)

/**
 * Grades the deterministic criteria of a contract (D143). Without a contract the task is graded on
 * the defaults every task owes: effects resolved and budget kept. Pure.
 */
export const grade = (acceptance: Acceptance | null, evidence: Evidence): ReadonlyArray<Check> => {
  const contract = acceptance ?? { effects_resolved: true, budget_not_exceeded: true }
  const checks: Array<Check> = []
  if (contract.required_events !== undefined) {
    const seen = new Set(
      evidence.events.filter((e) => e.source === "router" || !routerOnly(e.type)).map((e) => e.type)
    )
    const missing = contract.required_events.filter((type) => !seen.has(type))
    checks.push({
      name: "required_events",
      passed: missing.length === 0,
      detail: missing.length === 0 ? "every required event is in the log" : `missing: ${missing.join(", ")}`
    })
  }
  if (contract.effects_resolved === true) {
    checks.push({
      name: "effects_resolved",
      passed: evidence.unresolvedEffects.length === 0,
      detail:
        evidence.unresolvedEffects.length === 0
          ? "every effect completed or was abandoned"
          : `unresolved: ${evidence.unresolvedEffects.join(", ")}`
    })
  }
  if (contract.budget_not_exceeded === true) {
    const kept = evidence.spent + evidence.held <= evidence.budget && evidence.steps <= evidence.maxSteps
    checks.push({
      name: "budget_not_exceeded",
      passed: kept,
      detail: `spent ${evidence.spent} of ${evidence.budget} base units (${evidence.held} held), ${evidence.steps} of ${evidence.maxSteps} steps`
    })
  }
  if (contract.required_approvals !== undefined) {
    const missing = contract.required_approvals.filter((id) => evidence.approvals.get(id) !== "granted")
    checks.push({
      name: "required_approvals",
      passed: missing.length === 0,
      detail:
        missing.length === 0 ? "every required approval is granted" : `not granted: ${missing.join(", ")}`
    })
  }
  if (contract.required_artifacts !== undefined) {
    const missing = contract.required_artifacts.filter((path) => !evidence.artifacts.has(path))
    checks.push({
      name: "required_artifacts",
      passed: missing.length === 0,
      detail:
        missing.length === 0
          ? "every required artifact is in the latest workspace snapshot"
          : `missing from the latest snapshot: ${missing.join(", ")}`
    })
  }
  if (contract.output_schema !== undefined) {
    const problems =
      evidence.output === undefined
        ? ["no output was submitted"]
        : violations(contract.output_schema, evidence.output)
    checks.push({
      name: "output_schema",
      passed: problems.length === 0,
      detail: problems.length === 0 ? "the output matches the schema" : problems.slice(0, 5).join("; ")
    })
  }
  return checks
}
