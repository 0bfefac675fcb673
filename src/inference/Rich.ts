import { isIP } from "node:net"

/**
 * The provider-neutral rich envelope `svc.rich` (spec 2.5), built from provider-native
 * grounding and the final reply text. Pure. Every rule about what may reach a renderer lives
 * here: which URLs are safe, which `[n]` markers become citations, which `[[rich:ID]]` markers
 * are honored. The Responses adapter projects its `url_citation` annotations from this module.
 *
 * Offsets (`start_index`, `end_index`) count Unicode code points of the final text, end
 * exclusive (docs/decisions.md).
 */

export interface RichSource {
  readonly id: string
  readonly kind: string
  readonly title: string
  readonly url: string
  readonly host: string
  readonly snippet: string
}

export interface RichAnnotation {
  readonly type: "url_citation"
  readonly start_index: number
  readonly end_index: number
  readonly source_ids: ReadonlyArray<string>
}

export interface RichImage {
  readonly id: string
  /** The image itself: https only (a renderer embeds it). */
  readonly image_url: string
  /** The page the image came from. */
  readonly page_url: string
  readonly host: string
  readonly title: string
  /** Known sources the image belongs to (may be empty). */
  readonly source_ids: ReadonlyArray<string>
}

export interface RichPlace {
  readonly id: string
  readonly name: string
  readonly latitude: number
  readonly longitude: number
  /** Built by the router from the coordinates on a fixed map backend, never taken from a provider. */
  readonly map_url: string
  readonly source_name: string
  readonly address?: string
}

export interface RichBlock {
  readonly id: string
  readonly type: "source_list"
  readonly source_ids: ReadonlyArray<string>
}

/** Where an honored `[[rich:BLOCK_ID]]` marker sits in the text: the renderer puts the block there. */
export interface RichBlockRef {
  readonly block_id: string
  readonly start_index: number
  readonly end_index: number
}

export interface RichEnvelope {
  readonly version: 1
  readonly sources: ReadonlyArray<RichSource>
  readonly annotations: ReadonlyArray<RichAnnotation>
  readonly images: ReadonlyArray<RichImage>
  readonly places: ReadonlyArray<RichPlace>
  readonly blocks: ReadonlyArray<RichBlock>
  readonly block_refs: ReadonlyArray<RichBlockRef>
}

/** Provider-native grounding, as untrusted input. */
export interface NativeSource {
  readonly id: string
  readonly title: string
  readonly url: string
  readonly snippet: string
  readonly kind?: string | undefined
}
export interface NativeImage {
  readonly image_url: string
  readonly page_url: string
  readonly title?: string | undefined
  readonly source_id?: string | undefined
}
export interface NativePlace {
  readonly name: string
  readonly latitude: number
  readonly longitude: number
  readonly source_name?: string | undefined
  readonly address?: string | undefined
}
export interface NativeBlock {
  readonly id: string
  readonly type: string
  readonly source_ids: ReadonlyArray<string>
}
export interface Grounding {
  readonly sources: ReadonlyArray<NativeSource>
  readonly images?: ReadonlyArray<NativeImage> | undefined
  readonly places?: ReadonlyArray<NativePlace> | undefined
  readonly blocks?: ReadonlyArray<NativeBlock> | undefined
}

/** The block the router adds whenever a reply has safe sources. */
export const SOURCES_BLOCK_ID = "sources"
/** The fixed map backend place links are built on (spec 2.5 rule 4). */
export const MAP_BACKEND = "https://www.openstreetmap.org/"

const MAX_URL_LENGTH = 2048
const MAX_ITEMS = 50
const MAX_TITLE = 300
const MAX_SNIPPET = 1000
const BLOCK_ID = /^[A-Za-z0-9_-]{1,64}$/

// ---------------------------------------------------------------------------------------------
// URL validation: syntactic, after WHATWG normalization (the router never fetches these URLs,
// so DNS is not consulted; what reaches a caller names a public host by its written form).

const privateV4 = (a: number, b: number, c: number): boolean =>
  a === 0 ||
  a === 10 ||
  a === 127 ||
  (a === 100 && b >= 64 && b <= 127) ||
  (a === 169 && b === 254) ||
  (a === 172 && b >= 16 && b <= 31) ||
  (a === 192 && b === 0 && (c === 0 || c === 2)) ||
  (a === 192 && b === 168) ||
  (a === 198 && (b === 18 || b === 19)) ||
  (a === 198 && b === 51 && c === 100) ||
  (a === 203 && b === 0 && c === 113) ||
  a >= 224

const privateV4Text = (address: string): boolean => {
  const [a = 0, b = 0, c = 0] = address.split(".").map(Number)
  return privateV4(a, b, c)
}

/** The eight 16-bit groups of an IPv6 literal (an embedded dotted IPv4 tail included). */
const hextets = (address: string): ReadonlyArray<number> | undefined => {
  const parse = (part: string): Array<number> => {
    if (part === "") return []
    return part.split(":").flatMap((group) => {
      if (group.includes(".")) {
        const [a = 0, b = 0, c = 0, d = 0] = group.split(".").map(Number)
        return [(a << 8) | b, (c << 8) | d]
      }
      return [Number.parseInt(group, 16)]
    })
  }
  const halves = address.split("::")
  if (halves.length > 2) return undefined
  const head = parse(halves[0]!)
  const tail = halves.length === 2 ? parse(halves[1]!) : []
  const fill = halves.length === 2 ? 8 - head.length - tail.length : 0
  const groups = [...head, ...Array.from({ length: Math.max(0, fill) }, () => 0), ...tail]
  return groups.length === 8 && groups.every((g) => Number.isInteger(g) && g >= 0 && g <= 0xffff)
    ? groups
    : undefined
}

const embeddedV4Private = (hi: number, lo: number) => privateV4(hi >> 8, hi & 0xff, lo >> 8)

const privateV6 = (address: string): boolean => {
  const h = hextets(address)
  if (h === undefined) return true
  const [h0, h1, h2, h3, h4, h5, h6, h7] = h as [
    number,
    number,
    number,
    number,
    number,
    number,
    number,
    number
  ]
  const zeroTo = (n: number) => h.slice(0, n).every((g) => g === 0)
  if (zeroTo(5) && h5 === 0xffff) return embeddedV4Private(h6, h7) // ::ffff:a.b.c.d
  if (zeroTo(6)) return true // ::, ::1, IPv4-compatible (deprecated)
  if (h0 === 0x64 && h1 === 0xff9b)
    return h2 !== 0 || h3 !== 0 || h4 !== 0 || h5 !== 0 || embeddedV4Private(h6, h7)
  if (h0 === 0x2002) return embeddedV4Private(h1, h2) // 6to4
  if (h0 === 0x2001 && (h1 === 0 || h1 === 0x0db8)) return true // Teredo, documentation
  if (h0 === 0x0100 && h1 === 0 && h2 === 0 && h3 === 0) return true // discard-only
  return (
    (h0 & 0xfe00) === 0xfc00 ||
    (h0 & 0xffc0) === 0xfe80 ||
    (h0 & 0xffc0) === 0xfec0 ||
    (h0 & 0xff00) === 0xff00
  )
}

/** Names that only resolve inside a network (or nowhere). */
const privateSuffixes = [
  "localhost",
  "local",
  "localdomain",
  "internal",
  "intranet",
  "lan",
  "corp",
  "private",
  "home.arpa",
  "arpa",
  "test",
  "invalid"
]

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/

const publicHostname = (host: string): boolean => {
  if (host.length === 0 || host.length > 253) return false
  const labels = host.split(".")
  if (labels.length < 2 || !labels.every((l) => LABEL.test(l))) return false
  if (/^[0-9]+$/.test(labels.at(-1)!)) return false
  return !privateSuffixes.some((suffix) => host === suffix || host.endsWith(`.${suffix}`))
}

/** A normalized URL a caller may link to, or undefined. */
const safeUrl = (value: unknown, schemes: ReadonlyArray<string>): URL | undefined => {
  if (typeof value !== "string" || value.length === 0 || value.length > MAX_URL_LENGTH) return undefined
  let url: URL
  try {
    url = new URL(value)
  } catch {
    return undefined
  }
  if (!schemes.includes(url.protocol)) return undefined
  if (url.username !== "" || url.password !== "") return undefined
  if (url.href.length > MAX_URL_LENGTH) return undefined
  const host = url.hostname
    .replace(/^\[|\]$/g, "")
    .replace(/\.$/, "")
    .toLowerCase()
  const family = isIP(host)
  if (family === 4) return privateV4Text(host) ? undefined : url
  if (family === 6) return privateV6(host) ? undefined : url
  return publicHostname(host) ? url : undefined
}

const LINK_SCHEMES = ["https:", "http:"]
const IMAGE_SCHEMES = ["https:"]

/** An external link a caller may render: http(s), a public host, no credentials. */
export const isSafeExternalUrl = (value: string): boolean => safeUrl(value, LINK_SCHEMES) !== undefined

/** An image a renderer may embed: as a link, and https only. */
export const isSafeImageUrl = (value: string): boolean => safeUrl(value, IMAGE_SCHEMES) !== undefined

// ---------------------------------------------------------------------------------------------

const clip = (value: unknown, max: number): string => {
  if (typeof value !== "string") return ""
  const points = Array.from(value)
  return points.length <= max ? value : points.slice(0, max).join("")
}

const hostOf = (url: URL) => url.hostname.replace(/\.$/, "")

/** The sources a caller may see: ids unique (first wins), URLs safe and normalized. */
export const richSources = (native: ReadonlyArray<NativeSource>): ReadonlyArray<RichSource> => {
  const out: Array<RichSource> = []
  const seen = new Set<string>()
  for (const source of native) {
    if (out.length >= MAX_ITEMS) break
    if (typeof source.id !== "string" || source.id.length === 0 || source.id.length > 128) continue
    if (seen.has(source.id)) continue
    const url = safeUrl(source.url, LINK_SCHEMES)
    if (url === undefined) continue
    seen.add(source.id)
    out.push({
      id: source.id,
      kind: typeof source.kind === "string" && /^[a-z_]{1,32}$/.test(source.kind) ? source.kind : "web",
      title: clip(source.title, MAX_TITLE),
      url: url.href,
      host: hostOf(url),
      snippet: clip(source.snippet, MAX_SNIPPET)
    })
  }
  return out
}

const richImages = (native: ReadonlyArray<NativeImage>, known: ReadonlySet<string>) => {
  const out: Array<RichImage> = []
  for (const image of native) {
    if (out.length >= MAX_ITEMS) break
    const imageUrl = safeUrl(image.image_url, IMAGE_SCHEMES)
    const pageUrl = safeUrl(image.page_url, LINK_SCHEMES)
    if (imageUrl === undefined || pageUrl === undefined) continue
    out.push({
      id: `img_${out.length + 1}`,
      image_url: imageUrl.href,
      page_url: pageUrl.href,
      host: hostOf(pageUrl),
      title: clip(image.title, MAX_TITLE),
      source_ids: typeof image.source_id === "string" && known.has(image.source_id) ? [image.source_id] : []
    })
  }
  return out
}

const coordinate = (value: unknown, limit: number): number | undefined =>
  typeof value === "number" && Number.isFinite(value) && Math.abs(value) <= limit
    ? Math.round(value * 1e6) / 1e6
    : undefined

export const mapUrl = (latitude: number, longitude: number) =>
  `${MAP_BACKEND}?mlat=${latitude}&mlon=${longitude}#map=16/${latitude}/${longitude}`

const richPlaces = (native: ReadonlyArray<NativePlace>) => {
  const out: Array<RichPlace> = []
  for (const place of native) {
    if (out.length >= MAX_ITEMS) break
    const latitude = coordinate(place.latitude, 90)
    const longitude = coordinate(place.longitude, 180)
    const name = clip(place.name, MAX_TITLE)
    if (latitude === undefined || longitude === undefined || name === "") continue
    const address = clip(place.address, MAX_TITLE)
    out.push({
      id: `place_${out.length + 1}`,
      name,
      latitude,
      longitude,
      map_url: mapUrl(latitude, longitude),
      source_name: clip(place.source_name, MAX_TITLE) || "provider",
      ...(address === "" ? {} : { address })
    })
  }
  return out
}

const richBlocks = (native: ReadonlyArray<NativeBlock>, sources: ReadonlyArray<RichSource>) => {
  const known = new Set(sources.map((s) => s.id))
  const out: Array<RichBlock> = []
  if (sources.length > 0) out.push({ id: SOURCES_BLOCK_ID, type: "source_list", source_ids: [...known] })
  for (const block of native) {
    if (out.length >= MAX_ITEMS) break
    if (typeof block.id !== "string" || !BLOCK_ID.test(block.id) || block.type !== "source_list") continue
    if (out.some((b) => b.id === block.id)) continue
    const ids = [...new Set(Array.isArray(block.source_ids) ? block.source_ids : [])].filter((id) =>
      known.has(id)
    )
    if (ids.length > 0) out.push({ id: block.id, type: "source_list", source_ids: ids })
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Markers in the text

/** `[[rich:ID]]` first, so a block marker is never read as a citation; then `[n]`. */
const MARKER = /\[\[rich:([A-Za-z0-9_-]{1,64})\]\]|\[(\d{1,4})\]/g

export const codePointLength = (text: string): number => {
  let n = 0
  for (const _ of text) n++
  return n
}

/** Code-point offsets of regex matches, computed in one pass (matches arrive in order). */
const codePointCursor = (text: string) => {
  let utf16 = 0
  let points = 0
  return (index: number): number => {
    points += codePointLength(text.slice(utf16, index))
    utf16 = index
    return points
  }
}

interface Markers {
  readonly annotations: ReadonlyArray<RichAnnotation>
  readonly blockRefs: ReadonlyArray<RichBlockRef>
}

/** `[n]` cites source `n` only when `n` is a known id; `[[rich:ID]]` counts only for a known block. */
export const scanMarkers = (
  text: string,
  knownSources: ReadonlySet<string>,
  knownBlocks: ReadonlySet<string>
): Markers => {
  const annotations: Array<RichAnnotation> = []
  const blockRefs: Array<RichBlockRef> = []
  if (knownSources.size === 0 && knownBlocks.size === 0) return { annotations, blockRefs }
  const at = codePointCursor(text)
  for (const match of text.matchAll(MARKER)) {
    const [marker, blockId, sourceId] = match
    const honored = blockId !== undefined ? knownBlocks.has(blockId) : knownSources.has(sourceId!)
    if (!honored) continue
    const start = at(match.index)
    const end = start + codePointLength(marker)
    if (blockId !== undefined) blockRefs.push({ block_id: blockId, start_index: start, end_index: end })
    else
      annotations.push({ type: "url_citation", start_index: start, end_index: end, source_ids: [sourceId!] })
  }
  return { annotations, blockRefs }
}

/**
 * `svc.rich` for a reply, or undefined when the provider sent no grounding at all. Unsafe
 * sources, images and places are dropped; annotations and block references point only at
 * what survived.
 */
export const richEnvelope = (text: string, grounding: Grounding): RichEnvelope | undefined => {
  const nativeImages = grounding.images ?? []
  const nativePlaces = grounding.places ?? []
  if (grounding.sources.length === 0 && nativeImages.length === 0 && nativePlaces.length === 0)
    return undefined
  const sources = richSources(grounding.sources)
  const known = new Set(sources.map((s) => s.id))
  const blocks = richBlocks(grounding.blocks ?? [], sources)
  const { annotations, blockRefs } = scanMarkers(text, known, new Set(blocks.map((b) => b.id)))
  return {
    version: 1,
    sources,
    annotations,
    images: richImages(nativeImages, known),
    places: richPlaces(nativePlaces),
    blocks,
    block_refs: blockRefs
  }
}
