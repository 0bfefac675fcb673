import type { ChatCompletionRequest } from "../domain/Chat.ts"
import type { Collected } from "../inference/Collect.ts"
import { violations } from "../tasks/JsonSchema.ts"

/** How a case ended: served (then judged by its check) or refused with an error code. */
export type CaseOutcome =
  | { readonly _tag: "Served"; readonly collected: Collected }
  | { readonly _tag: "Refused"; readonly code: string; readonly status: string }

export interface EvalCase {
  readonly id: string
  readonly dialect: "openai" | "anthropic" | "responses"
  readonly exercises: string
  readonly request: (target: string) => ChatCompletionRequest
  /** `null`: passed; otherwise why not. */
  readonly check: (outcome: CaseOutcome) => string | null
}

const served = (outcome: CaseOutcome, then: (collected: Collected) => string | null) =>
  outcome._tag === "Refused"
    ? `refused (${outcome.code})`
    : outcome.collected.summary?.status !== "ok"
      ? `ended ${outcome.collected.summary?.status ?? "without a summary"}`
      : then(outcome.collected)

const ANSWER_SCHEMA = {
  type: "object",
  properties: { answer: { type: "string" }, confidence: { type: "number" } },
  required: ["answer", "confidence"],
  additionalProperties: false
}

/** About 6,000 prompt tokens of varied text, for the long-context case. */
const longDocument = Array.from(
  { length: 600 },
  (_, i) => `Line ${i}: the ledger records quote ${i * 7} cleared at tariff ${i % 13}.`
).join("\n")

/**
 * The fixed harness regression suite (spec 4.3; D146): each case is a call a coding-agent harness makes,
 * in the dialect it makes it in, with a check on what the router answered.
 */
export const HARNESS_REGRESSION: ReadonlyArray<EvalCase> = [
  {
    id: "plain-text",
    dialect: "openai",
    exercises: "a plain chat completion answers with text",
    request: (model) => ({
      model,
      messages: [{ role: "user", content: "Say hello in five words." }],
      max_tokens: 32
    }),
    check: (o) => served(o, (c) => (c.text.length > 0 ? null : "no text"))
  },
  {
    id: "streaming",
    dialect: "anthropic",
    exercises: "a streamed Messages call delivers text deltas and ends with a stop reason",
    request: (model) => ({
      model,
      messages: [{ role: "user", content: "Stream a short sentence about rivers." }],
      max_tokens: 48,
      stream: true
    }),
    check: (o) =>
      served(o, (c) =>
        c.text.length === 0 ? "no text" : c.summary?.finishReason === null ? "no finish reason" : null
      )
  },
  {
    id: "tool-call",
    dialect: "responses",
    exercises: "a forced function tool is called with JSON arguments",
    request: (model) => ({
      model,
      messages: [{ role: "user", content: "What is the weather in Lisbon?" }],
      max_tokens: 128,
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Current weather for a city",
            parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
          }
        }
      ],
      tool_choice: { type: "function", function: { name: "get_weather" } }
    }),
    check: (o) =>
      served(o, (c) => {
        const call = c.toolCalls[0]
        if (call === undefined) return "no tool call"
        if (call.name !== "get_weather") return `called ${call.name}`
        try {
          JSON.parse(call.arguments)
          return null
        } catch {
          return "arguments are not JSON"
        }
      })
  },
  {
    id: "strict-json",
    dialect: "openai",
    exercises: "strict JSON output matches its schema",
    request: (model) => ({
      model,
      messages: [{ role: "user", content: "Answer as JSON: what is the capital of Portugal?" }],
      max_tokens: 96,
      response_format: {
        type: "json_schema",
        json_schema: { name: "answer", strict: true, schema: ANSWER_SCHEMA }
      }
    }),
    check: (o) =>
      served(o, (c) => {
        try {
          const problems = violations(ANSWER_SCHEMA, JSON.parse(c.text))
          return problems.length === 0 ? null : problems.join("; ")
        } catch {
          return "the reply is not JSON"
        }
      })
  },
  {
    id: "long-context",
    dialect: "anthropic",
    exercises: "a long prompt (about 6,000 tokens) is served and metered",
    request: (model) => ({
      model,
      messages: [{ role: "user", content: `${longDocument}\n\nWhich line mentions quote 700?` }],
      max_tokens: 32
    }),
    check: (o) =>
      served(o, (c) =>
        (c.summary?.usage.promptTokens ?? 0) >= 4_000
          ? null
          : `only ${c.summary?.usage.promptTokens} prompt tokens`
      )
  },
  {
    id: "hosted-computer-tool",
    dialect: "responses",
    exercises: "a hosted computer-use tool is refused before any payment or provider work",
    request: (model) => ({
      model,
      messages: [{ role: "user", content: "Open the browser and click submit." }],
      max_tokens: 32,
      tools: [{ type: "computer_use_preview" }]
    }),
    check: (o) =>
      o._tag === "Refused" && o.status === "CapabilityUnsupported"
        ? null
        : o._tag === "Refused"
          ? `refused with ${o.code}, not as an unsupported capability`
          : "the hosted tool was served"
  }
]

export const SUITES: ReadonlyMap<string, ReadonlyArray<EvalCase>> = new Map([
  ["harness-regression-v1", HARNESS_REGRESSION]
])
