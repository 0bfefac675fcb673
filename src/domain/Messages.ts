import { Schema } from "effect"
import { MAX_TOKENS_LIMIT, Routing } from "./Chat.ts"
import { Int, Loose, optionalNullable } from "./Wire.ts"

/**
 * The Anthropic Messages wire: the request (what callers send the router and what the router sends a
 * Messages upstream), the message, and the event stream. One schema each, used by the router's
 * adapter and upstream client, by the simulated fleet and by the tests.
 */

/**
 * The request, as far as the router honours it. Unions end in a loose
 * `{type}` member so unsupported blocks and server tools are refused by name.
 */

const TextBlock = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
const ImageBlock = Schema.Struct({
  type: Schema.Literal("image"),
  source: Schema.Union([
    Schema.Struct({ type: Schema.Literal("base64"), media_type: Schema.String, data: Schema.String }),
    Schema.Struct({ type: Schema.Literal("url"), url: Schema.String }),
    Loose
  ])
})
/** A block of a tool result or of `system`. */
export const ResultBlock = Schema.Union([TextBlock, ImageBlock, Loose])
export type ResultBlock = typeof ResultBlock.Type
const ToolUseBlock = Schema.Struct({
  type: Schema.Literal("tool_use"),
  id: Schema.String,
  name: Schema.String,
  input: Schema.Unknown
})
const ToolResultBlock = Schema.Struct({
  type: Schema.Literal("tool_result"),
  tool_use_id: Schema.String,
  content: Schema.optionalKey(Schema.Union([Schema.String, Schema.Array(ResultBlock)])),
  is_error: optionalNullable(Schema.Boolean)
})
export const ContentBlock = Schema.Union([TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, Loose])
export type ContentBlock = typeof ContentBlock.Type

const Content = Schema.Union([Schema.String, Schema.Array(ContentBlock)])

export const MessageParam = Schema.Struct({
  role: Schema.Literals(["user", "assistant", "system"]),
  content: Content
})
export type MessageParam = typeof MessageParam.Type

const CustomTool = Schema.Struct({
  type: optionalNullable(Schema.Literal("custom")),
  name: Schema.String,
  description: Schema.optionalKey(Schema.String),
  input_schema: Schema.Record(Schema.String, Schema.Unknown),
  strict: Schema.optionalKey(Schema.Boolean)
})
export const MessagesTool = Schema.Union([CustomTool, Loose])

const ToolChoice = Schema.Union([
  Schema.Struct({ type: Schema.Literals(["auto", "any", "none"]) }),
  Schema.Struct({ type: Schema.Literal("tool"), name: Schema.String })
])

const Thinking = Schema.Union([
  Schema.Struct({ type: Schema.Literal("enabled"), budget_tokens: Int(1) }),
  Schema.Struct({ type: Schema.Literal("adaptive"), display: optionalNullable(Schema.String) }),
  Loose
])

const JsonOutputFormat = Schema.Struct({
  type: Schema.Literal("json_schema"),
  schema: Schema.Record(Schema.String, Schema.Unknown)
})

const messagesFields = {
  model: Schema.String.check(Schema.isMinLength(1)),
  messages: Schema.Array(MessageParam).check(Schema.isMinLength(1)),
  system: Schema.optionalKey(Schema.Union([Schema.String, Schema.Array(ResultBlock)])),
  tools: Schema.optionalKey(Schema.Array(MessagesTool)),
  tool_choice: Schema.optionalKey(ToolChoice),
  thinking: Schema.optionalKey(Thinking),
  output_config: Schema.optionalKey(
    Schema.Struct({
      effort: optionalNullable(Schema.Literals(["low", "medium", "high", "xhigh", "max"])),
      format: optionalNullable(JsonOutputFormat)
    })
  ),
  /** The earlier spelling of `output_config.format`. */
  output_format: optionalNullable(JsonOutputFormat),
  stop_sequences: Schema.optionalKey(Schema.Array(Schema.String)),
  temperature: Schema.optionalKey(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  top_p: Schema.optionalKey(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  stream: Schema.optionalKey(Schema.Boolean),
  /** Anthropic's hosted MCP connector: decoded only to be refused by name. */
  mcp_servers: Schema.optionalKey(Schema.Array(Schema.Unknown)),
  /** Router extensions, as on chat completions. */
  routing: Schema.optionalKey(Routing),
  context: Schema.optionalKey(Schema.Unknown)
}

/** `max_tokens` is required, as in the Messages API (it is also the worst-case authorization). */
export const MessagesRequest = Schema.Struct({ ...messagesFields, max_tokens: Int(1, MAX_TOKENS_LIMIT) })
export type MessagesRequest = typeof MessagesRequest.Type

/** `POST /v1/messages/count_tokens` takes the same body without `max_tokens`. */
export const CountTokensRequest = Schema.Struct({
  ...messagesFields,
  max_tokens: Schema.optionalKey(Int(1, MAX_TOKENS_LIMIT))
})
export type CountTokensRequest = typeof CountTokensRequest.Type

// ---- the reply ----

/** Messages usage: `input_tokens` excludes cache reads and writes, which are reported beside it. */
export const MessagesUsage = Schema.Struct({
  input_tokens: optionalNullable(Schema.Int),
  output_tokens: optionalNullable(Schema.Int),
  cache_read_input_tokens: optionalNullable(Schema.Int),
  cache_creation_input_tokens: optionalNullable(Schema.Int)
})

/** Provider-native grounding (`svc_sources`), preserved as sent. */
export const SvcSources = Schema.Array(Schema.Unknown)

/** A content block of a reply. */
export const ReplyBlock = Schema.Union([
  Schema.Struct({ type: Schema.Literal("text"), text: Schema.String }),
  Schema.Struct({ type: Schema.Literal("thinking"), thinking: Schema.String, signature: Schema.String }),
  Schema.Struct({
    type: Schema.Literal("tool_use"),
    id: Schema.String,
    name: Schema.String,
    input: Schema.Unknown
  }),
  Loose
])

/** A message (`type: "message"`): the non-streaming reply, and the `message` of `message_start`. */
export const Message = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("message"),
  role: Schema.Literal("assistant"),
  model: Schema.String,
  content: Schema.Array(ReplyBlock),
  stop_reason: Schema.NullOr(Schema.String),
  stop_sequence: Schema.NullOr(Schema.String),
  usage: MessagesUsage,
  svc_sources: Schema.optionalKey(SvcSources),
  /** The router's auction, charge and links (spec 2.3), on replies from the router. */
  svc: Schema.optionalKey(Schema.Record(Schema.String, Schema.Unknown))
})
export type Message = typeof Message.Type

/**
 * The Messages event stream, as far as a reader needs it. Fields a writer always sends are optional
 * here, so one schema reads every conforming stream; unknown event types are skipped by readers.
 */
export const MessagesStreamEvent = Schema.Union([
  Schema.Struct({
    type: Schema.Literal("message_start"),
    message: Schema.Struct({
      usage: optionalNullable(MessagesUsage),
      svc_sources: optionalNullable(SvcSources)
    })
  }),
  Schema.Struct({
    type: Schema.Literal("content_block_start"),
    index: Schema.Int,
    content_block: Schema.Struct({
      type: Schema.String,
      id: optionalNullable(Schema.String),
      name: optionalNullable(Schema.String),
      text: optionalNullable(Schema.String),
      thinking: optionalNullable(Schema.String)
    })
  }),
  Schema.Struct({
    type: Schema.Literal("content_block_delta"),
    index: Schema.Int,
    delta: Schema.Struct({
      type: Schema.String,
      text: optionalNullable(Schema.String),
      thinking: optionalNullable(Schema.String),
      partial_json: optionalNullable(Schema.String),
      signature: optionalNullable(Schema.String)
    })
  }),
  Schema.Struct({ type: Schema.Literal("content_block_stop"), index: Schema.Int }),
  Schema.Struct({
    type: Schema.Literal("message_delta"),
    delta: optionalNullable(
      Schema.Struct({
        stop_reason: optionalNullable(Schema.String),
        stop_sequence: optionalNullable(Schema.String)
      })
    ),
    usage: optionalNullable(MessagesUsage)
  }),
  Schema.Struct({ type: Schema.Literal("message_stop") }),
  Schema.Struct({ type: Schema.Literal("ping") }),
  Schema.Struct({
    type: Schema.Literal("error"),
    error: optionalNullable(
      Schema.Struct({ type: optionalNullable(Schema.String), message: optionalNullable(Schema.String) })
    )
  })
])
export type MessagesStreamEvent = typeof MessagesStreamEvent.Type

/** Anthropic's error body. */
export const MessagesErrorBody = Schema.Struct({
  type: Schema.Literal("error"),
  /** `retryable` is set on a 503: the condition passes, send the same request again after `Retry-After`. */
  error: Schema.Struct({
    type: Schema.String,
    message: Schema.String,
    retryable: Schema.optionalKey(Schema.Boolean)
  })
})
