/**
 * The dialect-neutral stream every upstream is translated into before metering. The serve
 * step meters, bills and re-encodes these into the caller's dialect, so billing never
 * depends on which dialect the winning provider spoke.
 */
export type UpstreamEvent =
  | { readonly _tag: "TextDelta"; readonly text: string }
  | { readonly _tag: "ReasoningDelta"; readonly text: string }
  /** A piece of a tool call; `index` groups pieces; `id` and `name` arrive on the first piece. */
  | {
      readonly _tag: "ToolCallDelta"
      readonly index: number
      readonly id?: string | undefined
      readonly name?: string | undefined
      readonly argumentsDelta: string
    }
  /** Provider-native grounding sources (the simulated fleet's `svc_sources`), preserved as sent. */
  | { readonly _tag: "Sources"; readonly sources: ReadonlyArray<UpstreamSource> }
  | { readonly _tag: "Finish"; readonly reason: FinishReason }
  /** Provider-reported usage; absent fields mean the provider did not say. */
  | {
      readonly _tag: "Usage"
      readonly inputTokens?: number | undefined
      readonly outputTokens?: number | undefined
      readonly reasoningTokens?: number | undefined
      readonly cachedInputTokens?: number | undefined
    }

export type FinishReason = "stop" | "length" | "tool_calls" | "content_filter"

export interface UpstreamSource {
  readonly id: string
  readonly title: string
  readonly url: string
  readonly snippet: string
}
