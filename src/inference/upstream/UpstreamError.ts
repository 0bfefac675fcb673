import { Schema } from "effect"

/**
 * Why a call to an upstream provider failed:
 * - `http_status`: the provider answered with a non-2xx status (`status`, and `excerpt`: a
 *   short, redacted excerpt of its error body).
 * - `connect`: the request never got a response (refused, reset, DNS, bad URL).
 * - `timeout`: no response head, or no first body byte, within the first-byte timeout.
 * - `protocol`: a frame could not be read (not JSON, or not the dialect's shape).
 * - `provider_error`: the provider sent an error frame inside a 200 stream (Anthropic's
 *   `error` event, an OpenAI-compatible `{"error": ...}` chunk).
 * - `dropped`: the body ended, or broke, before the dialect's terminal event.
 *
 * Messages are written here and never carry the prompt; whether tokens had already been
 * forwarded when this happened is the caller's to track.
 */
export const UpstreamErrorReason = Schema.Literals([
  "http_status",
  "connect",
  "timeout",
  "protocol",
  "provider_error",
  "dropped"
])
export type UpstreamErrorReason = typeof UpstreamErrorReason.Type

export class UpstreamError extends Schema.TaggedError<UpstreamError>()("UpstreamError", {
  reason: UpstreamErrorReason,
  message: Schema.String,
  status: Schema.optional(Schema.Int),
  excerpt: Schema.optional(Schema.String)
}) {}

export const protocolError = (message: string) => new UpstreamError({ reason: "protocol", message })

export const providerError = (kind: string | undefined, message: string | undefined) =>
  new UpstreamError({
    reason: "provider_error",
    message: `upstream sent an error frame${kind === undefined ? "" : ` (${kind})`}`,
    ...(message === undefined ? {} : { excerpt: message.slice(0, 200) })
  })
