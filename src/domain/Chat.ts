import { Schema } from "effect"

/** Decided in docs/decisions.md: omitted `max_tokens` means 1024; the ceiling is 131,072. */
export const DEFAULT_MAX_TOKENS = 1024
export const MAX_TOKENS_LIMIT = 131_072

const Int = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  Schema.Int.check(Schema.isGreaterThanOrEqualTo(min), Schema.isLessThanOrEqualTo(max))
const Fraction = Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))

export const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
export const ImagePart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({ url: Schema.String, detail: Schema.optionalKey(Schema.String) })
})
export const ContentPart = Schema.Union([TextPart, ImagePart])
export const Content = Schema.Union([Schema.String, Schema.Array(ContentPart)])

export const ToolCall = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Schema.String, arguments: Schema.String })
})
export type ToolCall = typeof ToolCall.Type

export const ChatMessage = Schema.Struct({
  role: Schema.Literals(["system", "developer", "user", "assistant", "tool"]),
  content: Schema.optionalKey(Schema.NullOr(Content)),
  name: Schema.optionalKey(Schema.String),
  tool_calls: Schema.optionalKey(Schema.Array(ToolCall)),
  tool_call_id: Schema.optionalKey(Schema.String)
})
export type ChatMessage = typeof ChatMessage.Type

export const FunctionTool = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: Schema.String,
    description: Schema.optionalKey(Schema.String),
    parameters: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown)),
    strict: Schema.optionalKey(Schema.NullOr(Schema.Boolean))
  })
})
/** Vendor-native hosted tools (any other `type`): decoded only so the gate can refuse them by name. */
export const HostedTool = Schema.Struct({
  type: Schema.String.check(
    Schema.makeFilter((type) =>
      type === "function" ? "a function tool needs a `function` object" : undefined
    )
  )
})
export const AnyTool = Schema.Union([FunctionTool, HostedTool])

export const LatencySloField = Schema.Struct({
  metric: Schema.Literal("first_token"),
  deadline_ms: Int(1, 600_000),
  confidence: Schema.Finite.check(Schema.isBetween({ minimum: 0.5, maximum: 0.999 }))
})

export const Routing = Schema.Struct({
  session_id: Schema.optionalKey(Schema.String.check(Schema.isPattern(/^[A-Za-z0-9._:-]{1,128}$/))),
  task: Schema.optionalKey(Schema.String),
  min_quality: Schema.optionalKey(Fraction),
  latency_slo: Schema.optionalKey(LatencySloField),
  speculative: Schema.optionalKey(Schema.Unknown)
})
export type Routing = typeof Routing.Type

export const ReasoningEffort = Schema.Literals(["none", "minimal", "low", "medium", "high"])

/** Spec 2.1. `model` and `messages` are mandatory (docs/decisions.md). */
export const ChatCompletionRequest = Schema.Struct({
  model: Schema.String.check(Schema.isMinLength(1)),
  messages: Schema.Array(ChatMessage).check(Schema.isMinLength(1)),
  max_tokens: Schema.optionalKey(Int(1, MAX_TOKENS_LIMIT)),
  max_completion_tokens: Schema.optionalKey(Int(1, MAX_TOKENS_LIMIT)),
  stream: Schema.optionalKey(Schema.Boolean),
  stream_options: Schema.optionalKey(Schema.Struct({ include_usage: Schema.optionalKey(Schema.Boolean) })),
  include_reasoning: Schema.optionalKey(Schema.Boolean),
  reasoning_effort: Schema.optionalKey(ReasoningEffort),
  routing: Schema.optionalKey(Routing),
  context: Schema.optionalKey(Schema.Unknown),
  tools: Schema.optionalKey(Schema.Array(AnyTool)),
  tool_choice: Schema.optionalKey(Schema.Unknown),
  response_format: Schema.optionalKey(Schema.Unknown),
  temperature: Schema.optionalKey(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 2 }))),
  top_p: Schema.optionalKey(Fraction),
  stop: Schema.optionalKey(Schema.Union([Schema.String, Schema.Array(Schema.String)])),
  user: Schema.optionalKey(Schema.String),
  seed: Schema.optionalKey(Schema.Int)
})
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const maxTokensOf = (request: ChatCompletionRequest) =>
  request.max_completion_tokens ?? request.max_tokens ?? DEFAULT_MAX_TOKENS
