import { Schema } from "effect"
import { MAX_TOKENS_LIMIT, Routing, Svc, SvcSources } from "./Chat.ts"
import { Int, Loose, optionalNullable } from "./Wire.ts"

/**
 * The OpenAI Responses wire: the request the router accepts and the response object it returns
 * (the same object closes the event stream, in `response.completed`).
 */

/**
 * The request, as far as the router honours it. Each union ends in a loose
 * `{type}` member so an unsupported item, part or tool is refused by name (and hosted tools
 * reach the capability gate) instead of failing as an opaque schema mismatch.
 */

const InputText = Schema.Struct({ type: Schema.Literal("input_text"), text: Schema.String })
const InputImage = Schema.Struct({
  type: Schema.Literal("input_image"),
  image_url: optionalNullable(Schema.String),
  file_id: optionalNullable(Schema.String),
  detail: optionalNullable(Schema.String)
})
const OutputText = Schema.Struct({ type: Schema.Literal("output_text"), text: Schema.String })
const Refusal = Schema.Struct({ type: Schema.Literal("refusal"), refusal: Schema.String })
export const ResponsesContentPart = Schema.Union([InputText, InputImage, OutputText, Refusal, Loose])
export type ResponsesContentPart = typeof ResponsesContentPart.Type
const ContentPart = ResponsesContentPart

const MessageItem = Schema.Struct({
  type: Schema.optionalKey(Schema.Literal("message")),
  role: Schema.Literals(["user", "assistant", "system", "developer"]),
  content: Schema.Union([Schema.String, Schema.Array(ContentPart)])
})
const FunctionCallItem = Schema.Struct({
  type: Schema.Literal("function_call"),
  call_id: Schema.String,
  name: Schema.String,
  arguments: Schema.String
})
const FunctionCallOutputItem = Schema.Struct({
  type: Schema.Literal("function_call_output"),
  call_id: Schema.String,
  output: Schema.Union([Schema.String, Schema.Array(ContentPart)])
})
export const InputItem = Schema.Union([MessageItem, FunctionCallItem, FunctionCallOutputItem, Loose])
export type InputItem = typeof InputItem.Type

const FunctionToolDef = Schema.Struct({
  type: Schema.Literal("function"),
  name: Schema.String,
  description: optionalNullable(Schema.String),
  parameters: optionalNullable(Schema.Record(Schema.String, Schema.Unknown)),
  strict: optionalNullable(Schema.Boolean)
})
export const ResponsesTool = Schema.Union([FunctionToolDef, Loose])

const ToolChoice = Schema.Union([
  Schema.Literals(["auto", "none", "required"]),
  Schema.Struct({ type: Schema.Literal("function"), name: Schema.String }),
  Schema.Struct({
    type: Schema.Literal("allowed_tools"),
    mode: Schema.Literals(["auto", "required"]),
    tools: Schema.Array(Schema.Struct({ type: Schema.String, name: Schema.optionalKey(Schema.String) }))
  }),
  Loose
])

const TextFormat = Schema.Union([
  Schema.Struct({ type: Schema.Literal("text") }),
  Schema.Struct({ type: Schema.Literal("json_object") }),
  Schema.Struct({
    type: Schema.Literal("json_schema"),
    name: Schema.String,
    schema: Schema.Record(Schema.String, Schema.Unknown),
    description: optionalNullable(Schema.String),
    strict: optionalNullable(Schema.Boolean)
  })
])

export const ResponsesRequest = Schema.Struct({
  model: Schema.String.check(Schema.isMinLength(1)),
  input: Schema.Union([Schema.String, Schema.Array(InputItem)]),
  instructions: optionalNullable(Schema.String),
  tools: optionalNullable(Schema.Array(ResponsesTool)),
  tool_choice: optionalNullable(ToolChoice),
  parallel_tool_calls: optionalNullable(Schema.Boolean),
  text: optionalNullable(Schema.Struct({ format: optionalNullable(TextFormat) })),
  reasoning: optionalNullable(
    Schema.Struct({
      effort: optionalNullable(Schema.Literals(["none", "minimal", "low", "medium", "high", "xhigh"])),
      summary: optionalNullable(Schema.String)
    })
  ),
  max_output_tokens: optionalNullable(Int(1, MAX_TOKENS_LIMIT)),
  stream: optionalNullable(Schema.Boolean),
  temperature: optionalNullable(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 2 }))),
  top_p: optionalNullable(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  previous_response_id: optionalNullable(Schema.String),
  conversation: optionalNullable(Schema.Unknown),
  background: optionalNullable(Schema.Boolean),
  /** Router extensions, as on chat completions. */
  include_reasoning: Schema.optionalKey(Schema.Boolean),
  routing: Schema.optionalKey(Routing),
  context: Schema.optionalKey(Schema.Unknown)
})
export type ResponsesRequest = typeof ResponsesRequest.Type

// ---- the response object ----

export const ResponseUsage = Schema.Struct({
  input_tokens: Schema.Int,
  input_tokens_details: Schema.Struct({ cached_tokens: Schema.Int }),
  output_tokens: Schema.Int,
  output_tokens_details: Schema.Struct({ reasoning_tokens: Schema.Int }),
  total_tokens: Schema.Int,
  cost: Schema.Number,
  svc_estimates: Schema.optionalKey(Schema.Record(Schema.String, Schema.Boolean))
})

const ItemStatus = Schema.Literals(["in_progress", "completed", "incomplete"])

export const OutputItem = Schema.Union([
  Schema.Struct({
    type: Schema.Literal("message"),
    id: Schema.String,
    status: ItemStatus,
    role: Schema.Literal("assistant"),
    content: Schema.Array(
      Schema.Struct({
        type: Schema.Literal("output_text"),
        text: Schema.String,
        annotations: Schema.Array(Schema.Unknown),
        logprobs: Schema.Array(Schema.Unknown)
      })
    )
  }),
  Schema.Struct({
    type: Schema.Literal("reasoning"),
    id: Schema.String,
    summary: Schema.Array(Schema.Unknown),
    content: Schema.Array(Schema.Struct({ type: Schema.Literal("reasoning_text"), text: Schema.String })),
    status: ItemStatus
  }),
  Schema.Struct({
    type: Schema.Literal("function_call"),
    id: Schema.String,
    call_id: Schema.String,
    name: Schema.String,
    arguments: Schema.String,
    status: ItemStatus
  })
])

/** A response object: the non-streaming reply, and the `response` of the stream's lifecycle events. */
export const ResponseObject = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("response"),
  created_at: Schema.Int,
  status: Schema.Literals(["in_progress", "completed", "incomplete", "failed"]),
  error: Schema.NullOr(Schema.Struct({ code: Schema.String, message: Schema.String })),
  incomplete_details: Schema.NullOr(Schema.Struct({ reason: Schema.String })),
  model: Schema.String,
  output: Schema.Array(OutputItem),
  instructions: Schema.NullOr(Schema.String),
  max_output_tokens: Schema.NullOr(Schema.Int),
  parallel_tool_calls: Schema.Boolean,
  previous_response_id: Schema.Null,
  reasoning: Schema.Struct({ effort: Schema.NullOr(Schema.String), summary: Schema.NullOr(Schema.String) }),
  store: Schema.Boolean,
  temperature: Schema.NullOr(Schema.Number),
  text: Schema.Struct({ format: Schema.Unknown }),
  tool_choice: Schema.Unknown,
  tools: Schema.Array(Schema.Unknown),
  top_p: Schema.NullOr(Schema.Number),
  truncation: Schema.String,
  metadata: Schema.Record(Schema.String, Schema.Unknown),
  usage: Schema.NullOr(ResponseUsage),
  svc_sources: Schema.optionalKey(SvcSources),
  svc: Svc
})
export type ResponseObject = typeof ResponseObject.Type
