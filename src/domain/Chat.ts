import { Schema } from "effect"
import { optionalNullable } from "./Wire.ts"

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

/**
 * A task label (`routing.task`, and the `task` of a rating): 1 to 64 characters, letters, digits, space
 * and `._:/-`, starting with a letter or digit; compared exactly (docs/decisions.md D232).
 */
export const TaskLabel = Schema.String.check(
  Schema.isPattern(/^[A-Za-z0-9][A-Za-z0-9 ._:/-]{0,63}$/, {
    message:
      "a task label is 1 to 64 characters (letters, digits, space and ._:/-), starting with a letter or digit"
  })
)

export const Routing = Schema.Struct({
  session_id: Schema.optionalKey(Schema.String.check(Schema.isPattern(/^[A-Za-z0-9._:-]{1,128}$/))),
  task: Schema.optionalKey(TaskLabel),
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

// ---- parts of a request the request schema passes through as sent ----

/** `tool_choice: {type: "function", function: {name}}`: one named tool is forced. */
export const NamedToolChoice = Schema.Struct({ function: Schema.Struct({ name: Schema.String }) })

/** `response_format` of the JSON kinds (`json_schema` with its schema, or `json_object`). */
export const JsonResponseFormat = Schema.Union([
  Schema.Struct({
    type: Schema.Literal("json_schema"),
    json_schema: Schema.Struct({ schema: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown)) })
  }),
  Schema.Struct({ type: Schema.Literal("json_object") })
])

// ---- the reply ----

/** Usage as a reader needs it (every count optional: a provider may leave any out). */
export const ChatUsage = Schema.Struct({
  prompt_tokens: optionalNullable(Schema.Int),
  completion_tokens: optionalNullable(Schema.Int),
  total_tokens: optionalNullable(Schema.Int),
  prompt_tokens_details: optionalNullable(Schema.Struct({ cached_tokens: optionalNullable(Schema.Int) })),
  completion_tokens_details: optionalNullable(
    Schema.Struct({ reasoning_tokens: optionalNullable(Schema.Int) })
  ),
  /** The router's charge in whole units (spec 2.3). */
  cost: Schema.optionalKey(Schema.Number),
  /** Counts that are the router's tokenizer estimate (spec 2.3). */
  svc_estimates: Schema.optionalKey(Schema.Record(Schema.String, Schema.Boolean))
})
export type ChatUsage = typeof ChatUsage.Type

/** Provider-native grounding (`svc_sources`), preserved as sent. */
export const SvcSources = Schema.Array(Schema.Unknown)

/** The router's `svc` object (spec 2.3): routing, the auction as cleared, process, links, `rich`. */
export const Svc = Schema.Record(Schema.String, Schema.Unknown)

/** A non-streaming chat completion (spec 2.3). */
export const ChatCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(
    Schema.Struct({
      index: Schema.Int,
      message: Schema.Struct({
        role: Schema.Literal("assistant"),
        content: Schema.NullOr(Schema.String),
        refusal: optionalNullable(Schema.String),
        reasoning_content: Schema.optionalKey(Schema.String),
        tool_calls: Schema.optionalKey(Schema.Array(ToolCall))
      }),
      logprobs: optionalNullable(Schema.Unknown),
      finish_reason: Schema.String
    })
  ),
  usage: ChatUsage,
  svc_sources: Schema.optionalKey(SvcSources),
  svc: Schema.optionalKey(Svc)
})
export type ChatCompletion = typeof ChatCompletion.Type

const ToolCallDelta = Schema.Struct({
  index: optionalNullable(Schema.Int),
  id: optionalNullable(Schema.String),
  type: optionalNullable(Schema.String),
  function: optionalNullable(
    Schema.Struct({ name: optionalNullable(Schema.String), arguments: optionalNullable(Schema.String) })
  )
})

const Delta = Schema.Struct({
  role: optionalNullable(Schema.String),
  content: optionalNullable(Schema.String),
  reasoning_content: optionalNullable(Schema.String),
  reasoning: optionalNullable(Schema.String),
  refusal: optionalNullable(Schema.String),
  tool_calls: optionalNullable(Schema.Array(ToolCallDelta))
})

/**
 * One `chat.completion.chunk` of a stream (spec 2.4), as far as a reader needs it: a provider's
 * chunks and the router's alike. An `error` chunk ends a stream that broke after its first token.
 */
export const ChatCompletionChunk = Schema.Struct({
  id: optionalNullable(Schema.String),
  object: optionalNullable(Schema.String),
  created: optionalNullable(Schema.Int),
  model: optionalNullable(Schema.String),
  choices: optionalNullable(
    Schema.Array(
      Schema.Struct({
        index: Schema.Int,
        delta: optionalNullable(Delta),
        logprobs: optionalNullable(Schema.Unknown),
        finish_reason: optionalNullable(Schema.String)
      })
    )
  ),
  usage: optionalNullable(ChatUsage),
  svc_sources: optionalNullable(SvcSources),
  svc: Schema.optionalKey(Svc),
  error: optionalNullable(
    Schema.Struct({
      message: optionalNullable(Schema.String),
      type: optionalNullable(Schema.String),
      // Some providers send numeric codes.
      code: optionalNullable(Schema.Union([Schema.String, Schema.Number])),
      param: optionalNullable(Schema.String)
    })
  )
})
export type ChatCompletionChunk = typeof ChatCompletionChunk.Type

/** OpenAI's error body. */
export const OpenAiErrorBody = Schema.Struct({
  error: Schema.Struct({
    message: Schema.String,
    type: Schema.String,
    code: Schema.NullOr(Schema.String),
    param: Schema.NullOr(Schema.String),
    /** Set on a 503: the condition passes, send the same request again after `Retry-After`. */
    retryable: Schema.optionalKey(Schema.Boolean)
  })
})
