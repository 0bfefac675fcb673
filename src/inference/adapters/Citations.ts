import { isIP } from "node:net"
import type { UpstreamSource } from "../Events.ts"

/**
 * Citation projection for the adapters: `[n]` in the reply cites the grounding source whose id
 * is `"n"` (the simulated fleet's convention, docs/decisions.md D15). Unknown ids never
 * become citations, and a source whose URL fails validation is never cited.
 */

export interface UrlCitation {
  readonly type: "url_citation"
  /** Character (code point) offsets of the `[n]` marker in the text. */
  readonly start_index: number
  readonly end_index: number
  readonly url: string
  readonly title: string
}

const privateV4 = (address: string): boolean => {
  const [a = 0, b = 0] = address.split(".").map(Number)
  return (
    a === 0 ||
    a === 10 ||
    a === 127 ||
    (a === 100 && b >= 64 && b <= 127) ||
    (a === 169 && b === 254) ||
    (a === 172 && b >= 16 && b <= 31) ||
    (a === 192 && b === 168) ||
    a >= 224
  )
}

const privateV6 = (address: string): boolean => {
  const lower = address.toLowerCase()
  if (lower === "::" || lower === "::1") return true
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(lower)
  if (mapped !== null) return privateV4(mapped[1]!)
  return /^f[cd]/.test(lower) || /^fe[89ab]/.test(lower)
}

/** An external link a caller may render: http(s), a public host, no credentials. */
export const isSafeExternalUrl = (value: string): boolean => {
  let url: URL
  try {
    url = new URL(value)
  } catch {
    return false
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return false
  if (url.username !== "" || url.password !== "") return false
  const host = url.hostname.replace(/^\[|\]$/g, "").toLowerCase()
  if (host === "" || host === "localhost" || host.endsWith(".localhost")) return false
  if (host.endsWith(".local") || host.endsWith(".internal")) return false
  const family = isIP(host)
  if (family === 4) return !privateV4(host)
  if (family === 6) return !privateV6(host)
  return host.includes(".")
}

const marker = /\[(\d{1,4})\]/g

/** Code-point length of a string (what "character" offsets count, independent of the client's language). */
const codePoints = (text: string) => {
  let n = 0
  for (const _ of text) n++
  return n
}

export const citationAnnotations = (
  text: string,
  sources: ReadonlyArray<UpstreamSource>
): ReadonlyArray<UrlCitation> => {
  const known = new Map<string, UpstreamSource>()
  for (const source of sources) if (isSafeExternalUrl(source.url)) known.set(source.id, source)
  if (known.size === 0) return []
  const out: Array<UrlCitation> = []
  let offset = 0
  let counted = 0
  for (const match of text.matchAll(marker)) {
    const source = known.get(match[1]!)
    if (source === undefined) continue
    counted += codePoints(text.slice(offset, match.index))
    offset = match.index
    const start = counted
    out.push({
      type: "url_citation",
      start_index: start,
      end_index: start + match[0].length,
      url: source.url,
      title: source.title
    })
  }
  return out
}
