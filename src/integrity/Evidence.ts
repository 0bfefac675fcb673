import { createHash } from "node:crypto"
import type { Schema } from "effect"
import type { Hex } from "viem"

/**
 * Canonical JSON (RFC 8785, JCS, for JSON values): no whitespace, object keys sorted by UTF-16 code
 * units, strings and numbers exactly as ECMAScript `JSON.stringify` writes them. The same value gives
 * the same bytes whatever key order or spacing it was sent with (docs/protocol.md section 7).
 */
export const canonicalJson = (value: Schema.Json): string => {
  if (value === null || typeof value !== "object") return JSON.stringify(value)
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`
  const object = value as Schema.JsonObject
  const keys = Object.keys(object).sort()
  return `{${keys.map((key) => `${JSON.stringify(key)}:${canonicalJson(object[key]!)}`).join(",")}}`
}

export interface Evidence {
  readonly receipt_id: string
  readonly summary: string
  readonly details: Schema.Json
}

/** The exact text an evidence hash covers. */
export const evidenceText = (evidence: Evidence) =>
  canonicalJson({ receipt_id: evidence.receipt_id, summary: evidence.summary, details: evidence.details })

/** Spec 2.10 `evidenceHash`: SHA-256 over the canonical JSON of `{receipt_id, summary, details}`. */
export const evidenceHash = (evidence: Evidence): Hex =>
  `0x${createHash("sha256").update(evidenceText(evidence), "utf8").digest("hex")}`
