import type { Effect, Schema } from "effect"
import type { SimReply, SimRequest } from "./Simulator.ts"

export type DialectName = "openai" | "anthropic"

/** One SSE frame as written on the wire, and how many completion tokens it carries (0 or 1). */
export interface SseFrame {
  readonly text: string
  readonly tokens: number
}

export interface ReplyMeta {
  readonly id: string
  readonly model: string
  /** Unix seconds. */
  readonly created: number
}

export type DialectErrorKind = "invalid_request" | "not_found" | "server_error"

/** A provider request decoded into the simulator's terms, before the model class is checked. */
export interface DecodedRequest {
  readonly model: string
  readonly stream: boolean
  readonly request: Omit<SimRequest, "modelClass">
}

/**
 * One wire format a simulated provider speaks. Grounded replies carry their sources in the
 * provider-native top-level field `svc_sources` (docs in ProviderServer.ts).
 */
export interface Dialect {
  readonly name: DialectName
  readonly path: `/${string}`
  readonly decode: (body: unknown) => Effect.Effect<DecodedRequest, Schema.SchemaError>
  readonly completion: (reply: SimReply, meta: ReplyMeta) => unknown
  readonly streamFrames: (reply: SimReply, meta: ReplyMeta) => ReadonlyArray<SseFrame>
  readonly errorStatus: (kind: DialectErrorKind) => number
  readonly errorBody: (kind: DialectErrorKind, message: string) => unknown
}
