import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { makeSseDecoder, type SseEvent } from "../../../src/inference/upstream/Sse.ts"

const encoder = new TextEncoder()

const decodeChunks = (chunks: ReadonlyArray<Uint8Array>): Array<SseEvent> => {
  const decoder = makeSseDecoder()
  const out: Array<SseEvent> = []
  for (const chunk of chunks) out.push(...decoder.push(chunk))
  out.push(...decoder.end())
  return out
}

/** Cuts bytes at the given offsets (sorted, deduplicated, inside the buffer). */
const splitAt = (bytes: Uint8Array, cuts: ReadonlyArray<number>): Array<Uint8Array> => {
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b)
  const chunks: Array<Uint8Array> = []
  let start = 0
  for (const point of [...points, bytes.length]) {
    chunks.push(bytes.subarray(start, point))
    start = point
  }
  return chunks
}

// Field values never contain line breaks; multi-line data is several `data:` lines.
const lineText = fc.string({ unit: "binary", maxLength: 12 }).map((s) => s.replace(/[\r\n]/g, " "))
const eventName = fc.option(fc.constantFrom("message", "content_block_delta", "ping", "évent"), {
  nil: undefined
})
const lineEnd = fc.constantFrom("\n", "\r\n", "\r")

interface Spec {
  readonly event: string | undefined
  readonly dataLines: ReadonlyArray<string>
  readonly id: string | undefined
  readonly comment: string | undefined
  readonly spaceAfterColon: boolean
}

const spec = fc.record({
  event: eventName,
  dataLines: fc.array(lineText, { minLength: 1, maxLength: 3 }),
  id: fc.option(fc.stringMatching(/^[a-z0-9]{1,4}$/), { nil: undefined }),
  comment: fc.option(lineText, { nil: undefined }),
  spaceAfterColon: fc.boolean()
})

/** Writes events with a chosen line ending per event, comments and optional field spacing. */
const serialize = (specs: ReadonlyArray<Spec>, endings: ReadonlyArray<string>): string =>
  specs
    .map((s, i) => {
      const nl = endings[i % endings.length]!
      const sp = s.spaceAfterColon ? " " : ""
      const lines = [
        ...(s.comment === undefined ? [] : [`:${s.comment}`]),
        ...(s.event === undefined ? [] : [`event:${sp}${s.event}`]),
        ...(s.id === undefined ? [] : [`id:${sp}${s.id}`]),
        // A value that itself starts with a space needs the separating space to keep it.
        ...s.dataLines.map((d) => `data:${sp || (d.startsWith(" ") ? " " : "")}${d}`)
      ]
      return lines.map((l) => l + nl).join("") + nl
    })
    .join("")

const expected = (specs: ReadonlyArray<Spec>): Array<SseEvent> => {
  let id: string | undefined
  return specs.map((s) => {
    id = s.id ?? id
    return { event: s.event, data: s.dataLines.join("\n"), id }
  })
}

describe("SSE decoder", () => {
  it("any split of a valid byte stream yields the same events", () => {
    fc.assert(
      fc.property(
        fc.array(spec, { maxLength: 8 }),
        fc.array(lineEnd, { minLength: 1, maxLength: 3 }),
        fc.array(fc.nat(), { maxLength: 20 }),
        (specs, endings, cuts) => {
          const bytes = encoder.encode(serialize(specs, endings))
          const whole = decodeChunks([bytes])
          assert.deepStrictEqual(whole, expected(specs))
          assert.deepStrictEqual(decodeChunks(splitAt(bytes, cuts)), whole)
        }
      ),
      { numRuns: 400 }
    )
  })

  it("decodes byte by byte, including multi-byte UTF-8 split across chunks", () => {
    const text = 'event: delta\r\ndata: {"text":"naïve 日本 🚀"}\r\n\r\n'
    const bytes = encoder.encode(text)
    const oneByteChunks = Array.from(bytes, (b) => Uint8Array.of(b))
    assert.deepStrictEqual(decodeChunks(oneByteChunks), [
      { event: "delta", data: '{"text":"naïve 日本 🚀"}', id: undefined }
    ])
  })

  it("treats a CR at a chunk end followed by LF as one line break", () => {
    const events = decodeChunks([
      encoder.encode("data: a\r"),
      encoder.encode("\ndata: b\r"),
      encoder.encode("\n\r\n")
    ])
    assert.deepStrictEqual(events, [{ event: undefined, data: "a\nb", id: undefined }])
  })

  it("skips comments and unknown fields, and events with no data", () => {
    const events = decodeChunks([
      encoder.encode(": keep-alive\n\nretry: 10\nfoo: bar\n\nevent: ping\n\ndata: x\n\n")
    ])
    assert.deepStrictEqual(events, [{ event: undefined, data: "x", id: undefined }])
  })

  it("discards an event cut off at the end of the stream", () => {
    const events = decodeChunks([encoder.encode('data: {"a":1}\n\ndata: {"b":')])
    assert.deepStrictEqual(events, [{ event: undefined, data: '{"a":1}', id: undefined }])
    assert.deepStrictEqual(decodeChunks([encoder.encode("data: whole line but no blank line\n")]), [])
  })

  it("strips a leading byte-order mark", () => {
    const bytes = new Uint8Array([0xef, 0xbb, 0xbf, ...encoder.encode("data: x\n\n")])
    assert.deepStrictEqual(decodeChunks(splitAt(bytes, [1, 2])), [
      { event: undefined, data: "x", id: undefined }
    ])
  })
})
