import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import {
  codePointLength,
  isSafeExternalUrl,
  isSafeImageUrl,
  MAP_BACKEND,
  type NativeSource,
  richEnvelope,
  SOURCES_BLOCK_ID
} from "../../src/inference/Rich.ts"

const slice = (text: string, start: number, end: number) => Array.from(text).slice(start, end).join("")

// ---------------------------------------------------------------------------------------------
// URLs

const privateV4 = fc.oneof(
  fc.tuple(fc.constant(10), fc.nat(255), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.constant(127), fc.nat(255), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.constant(0), fc.nat(255), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.constant(169), fc.constant(254), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.constant(172), fc.integer({ min: 16, max: 31 }), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.constant(192), fc.constant(168), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.constant(100), fc.integer({ min: 64, max: 127 }), fc.nat(255), fc.nat(255)),
  fc.tuple(fc.integer({ min: 224, max: 255 }), fc.nat(255), fc.nat(255), fc.nat(255))
)

/** The same private IPv4 address in the spellings a URL parser accepts. */
const v4Spellings = privateV4.chain(([a, b, c, d]) => {
  const n = ((a << 24) >>> 0) + (b << 16) + (c << 8) + d
  return fc.constantFrom(
    `${a}.${b}.${c}.${d}`,
    String(n),
    `0x${n.toString(16)}`,
    `0${a.toString(8)}.${b}.${c}.${d}`,
    `[::ffff:${a}.${b}.${c}.${d}]`,
    `[::ffff:${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}]`,
    `[64:ff9b::${a}.${b}.${c}.${d}]`,
    `[2002:${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}::1]`
  )
})

const privateV6 = fc.constantFrom(
  "[::1]",
  "[::]",
  "[0:0:0:0:0:0:0:1]",
  "[fd00:ec2::254]",
  "[fc00::1]",
  "[fe80::1]",
  "[febf::1]",
  "[ff02::1]",
  "[2001:db8::1]",
  "[::7f00:1]"
)

const privateNames = fc.oneof(
  fc
    .tuple(
      fc.constantFrom("", "app.", "a.b."),
      fc.constantFrom(
        "localhost",
        "LOCALHOST",
        "localhost.",
        "printer.local",
        "metadata.google.internal",
        "db.internal",
        "nas.lan",
        "router.home.arpa",
        "host.localdomain",
        "site.test"
      )
    )
    .map(([prefix, name]) => `${prefix}${name}`),
  // Single-label names resolve only through a local search domain.
  fc.constantFrom("intranet", "metadata", "instance-data", "wpad")
)

const unsafeUrls = fc.oneof(
  fc
    .tuple(fc.constantFrom("http", "https"), fc.oneof(v4Spellings, privateV6, privateNames), fc.webPath())
    .map(([scheme, host, path]) => `${scheme}://${host}${path}`),
  fc
    .tuple(
      fc.constantFrom("javascript:alert(1)", "data:text/html,hi", "file:///etc/passwd", "ftp://example.org/")
    )
    .map(([u]) => u),
  fc
    .tuple(fc.constantFrom("user@", "user:pw@", ":pw@"), fc.domain())
    .map(([credentials, host]) => `https://${credentials}${host}/`),
  fc.constantFrom("not a url", "", "https://", "//example.org/x", `https://example.org/${"a".repeat(2100)}`)
)

const safeUrls = fc
  .tuple(fc.constantFrom("https", "http"), fc.domain(), fc.webPath())
  .filter(
    ([, host]) => !/(^|\.)(local|localhost|internal|lan|test|invalid|arpa|corp|private|intranet)$/.test(host)
  )
  .map(([scheme, host, path]) => `${scheme}://${host}${path}`)

describe("URL validation", () => {
  it("refuses private, loopback, link-local and metadata addresses in every spelling (property)", () => {
    fc.assert(
      fc.property(unsafeUrls, (url) => {
        assert.isFalse(isSafeExternalUrl(url), url)
        assert.isFalse(isSafeImageUrl(url), url)
      }),
      { numRuns: 2_000 }
    )
  })

  it("accepts public http(s) hosts; images need https", () => {
    fc.assert(
      fc.property(safeUrls, (url) => {
        assert.isTrue(isSafeExternalUrl(url), url)
        assert.strictEqual(isSafeImageUrl(url), url.startsWith("https:"), url)
      }),
      { numRuns: 500 }
    )
    for (const url of [
      "https://8.8.8.8/",
      "https://[2606:4700::1111]/",
      "https://news.example.com:8443/a?b=1"
    ]) {
      assert.isTrue(isSafeExternalUrl(url), url)
    }
  })
})

// ---------------------------------------------------------------------------------------------
// The envelope

const sourceArb: fc.Arbitrary<NativeSource> = fc.record({
  id: fc.oneof(fc.integer({ min: 0, max: 9 }).map(String), fc.string({ maxLength: 4 })),
  title: fc.string({ maxLength: 20 }),
  url: fc.oneof(safeUrls, unsafeUrls),
  snippet: fc.string({ maxLength: 20 })
})

const textArb = fc
  .array(
    fc.oneof(
      fc.string({ maxLength: 12 }),
      fc.integer({ min: 0, max: 12 }).map((n) => `[${n}]`),
      fc.constantFrom("[[rich:sources]]", "[[rich:other]]", "[[rich:]]", "[[1]]", "🚀", "é", "[ 1 ]", "[x]")
    ),
    { maxLength: 16 }
  )
  .map((parts) => parts.join(""))

/** Every string value anywhere in a JSON value. */
const strings = (value: unknown): Array<string> =>
  typeof value === "string"
    ? [value]
    : Array.isArray(value)
      ? value.flatMap(strings)
      : typeof value === "object" && value !== null
        ? Object.values(value).flatMap(strings)
        : []

describe("svc.rich", () => {
  it("cites only known, safe sources, at well-ordered ranges inside the text (property)", () => {
    fc.assert(
      fc.property(textArb, fc.array(sourceArb, { maxLength: 8 }), (text, sources) => {
        const rich = richEnvelope(text, { sources })
        if (sources.length === 0) return assert.isUndefined(rich)
        assert.isDefined(rich)
        if (rich === undefined) return
        const length = codePointLength(text)
        const ids = new Set(rich.sources.map((s) => s.id))
        assert.strictEqual(ids.size, rich.sources.length, "source ids are unique")
        let previousEnd = 0
        for (const a of rich.annotations) {
          assert.strictEqual(a.type, "url_citation")
          assert.isAtLeast(a.start_index, previousEnd, "ordered and disjoint")
          assert.isBelow(a.start_index, a.end_index)
          assert.isAtMost(a.end_index, length)
          previousEnd = a.end_index
          assert.isAbove(a.source_ids.length, 0)
          for (const id of a.source_ids) assert.isTrue(ids.has(id), `annotation cites unknown ${id}`)
          assert.strictEqual(slice(text, a.start_index, a.end_index), `[${a.source_ids[0]}]`)
        }
        // Oracle: every `[n]` whose n is a surviving source id (a `[[rich:…]]` marker is never one).
        const withoutBlocks = text.replace(/\[\[rich:[A-Za-z0-9_-]{1,64}\]\]/g, (m) => "#".repeat(m.length))
        const expected = [...withoutBlocks.matchAll(/\[(\d{1,4})\]/g)].filter((m) => ids.has(m[1]!)).length
        assert.strictEqual(rich.annotations.length, expected)
        for (const ref of rich.block_refs) {
          assert.isTrue(
            rich.blocks.some((b) => b.id === ref.block_id),
            "only known blocks are honored"
          )
          assert.strictEqual(slice(text, ref.start_index, ref.end_index), `[[rich:${ref.block_id}]]`)
        }
        if (rich.sources.length === 0) assert.deepStrictEqual(rich.block_refs, [])
        for (const s of rich.sources) assert.isTrue(isSafeExternalUrl(s.url), s.url)
      }),
      { numRuns: 1_000 }
    )
  })

  it("no unsafe URL reaches the envelope, whatever the provider sends (property)", () => {
    const imageArb = fc.record({
      image_url: fc.oneof(safeUrls, unsafeUrls),
      page_url: fc.oneof(safeUrls, unsafeUrls),
      title: fc.string({ maxLength: 8 }),
      source_id: fc.constantFrom("1", "2", "nope")
    })
    const placeArb = fc.record({
      name: fc.string({ maxLength: 8 }),
      latitude: fc.double({ min: -200, max: 200, noNaN: false }),
      longitude: fc.double({ min: -400, max: 400, noNaN: false }),
      source_name: fc.string({ maxLength: 8 })
    })
    fc.assert(
      fc.property(
        fc.array(sourceArb, { maxLength: 6 }),
        fc.array(imageArb, { maxLength: 4 }),
        fc.array(placeArb, { maxLength: 4 }),
        (sources, images, places) => {
          const rich = richEnvelope("text [1] [2]", { sources, images, places })
          if (rich === undefined) return
          const urls = [
            ...rich.sources.map((s) => s.url),
            ...rich.images.flatMap((i) => [i.image_url, i.page_url]),
            ...rich.places.map((p) => p.map_url)
          ]
          for (const url of urls) assert.isTrue(isSafeExternalUrl(url), url)
          const unsafe = new Set(
            [...sources.map((s) => s.url), ...images.flatMap((i) => [i.image_url, i.page_url])].filter(
              (u) => u.length > 0 && !isSafeExternalUrl(u)
            )
          )
          for (const value of strings(rich)) assert.isFalse(unsafe.has(value), value)
          for (const image of rich.images) {
            assert.isTrue(isSafeImageUrl(image.image_url), image.image_url)
            for (const id of image.source_ids) assert.isTrue(rich.sources.some((s) => s.id === id))
          }
          for (const place of rich.places) {
            assert.isAtMost(Math.abs(place.latitude), 90)
            assert.isAtMost(Math.abs(place.longitude), 180)
            assert.isTrue(place.map_url.startsWith(MAP_BACKEND))
          }
        }
      ),
      { numRuns: 1_000 }
    )
  })

  it("builds sources, the source-list block, images and places as documented", () => {
    const text = "Rivers rise [1]. Also [2] and [3]. 🚀 Unknown [9]. [[rich:sources]] [[rich:missing]]"
    const rich = richEnvelope(text, {
      sources: [
        { id: "1", title: "One", url: "https://News.Example.org/a#frag", snippet: "s1" },
        { id: "2", title: "Meta", url: "http://169.254.169.254/latest", snippet: "s2" },
        { id: "3", title: "Three", url: "http://example.com/3", snippet: "s3", kind: "news" },
        { id: "1", title: "Duplicate", url: "https://example.net/", snippet: "dup" }
      ],
      images: [
        {
          image_url: "https://cdn.example.org/a.png",
          page_url: "https://example.org/a",
          title: "A",
          source_id: "1"
        },
        { image_url: "http://cdn.example.org/b.png", page_url: "https://example.org/b" }
      ],
      places: [
        { name: "Harbor", latitude: 59.3293234, longitude: 18.0686, source_name: "Maps" },
        { name: "Nowhere", latitude: 91, longitude: 0 }
      ],
      blocks: [
        { id: "picks", type: "source_list", source_ids: ["3", "2", "9"] },
        { id: "bad id!", type: "source_list", source_ids: ["1"] }
      ]
    })!
    assert.deepStrictEqual(rich.sources, [
      {
        id: "1",
        kind: "web",
        title: "One",
        url: "https://news.example.org/a#frag",
        host: "news.example.org",
        snippet: "s1"
      },
      {
        id: "3",
        kind: "news",
        title: "Three",
        url: "http://example.com/3",
        host: "example.com",
        snippet: "s3"
      }
    ])
    assert.deepStrictEqual(
      rich.annotations.map((a) => [slice(text, a.start_index, a.end_index), a.source_ids]),
      [
        ["[1]", ["1"]],
        ["[3]", ["3"]]
      ]
    )
    assert.deepStrictEqual(rich.blocks, [
      { id: SOURCES_BLOCK_ID, type: "source_list", source_ids: ["1", "3"] },
      { id: "picks", type: "source_list", source_ids: ["3"] }
    ])
    assert.deepStrictEqual(
      rich.block_refs.map((r) => [r.block_id, slice(text, r.start_index, r.end_index)]),
      [["sources", "[[rich:sources]]"]]
    )
    assert.deepStrictEqual(rich.images, [
      {
        id: "img_1",
        image_url: "https://cdn.example.org/a.png",
        page_url: "https://example.org/a",
        host: "example.org",
        title: "A",
        source_ids: ["1"]
      }
    ])
    assert.deepStrictEqual(rich.places, [
      {
        id: "place_1",
        name: "Harbor",
        latitude: 59.329323,
        longitude: 18.0686,
        map_url: `${MAP_BACKEND}?mlat=59.329323&mlon=18.0686#map=16/59.329323/18.0686`,
        source_name: "Maps"
      }
    ])
    assert.strictEqual(rich.version, 1)
  })

  it("is absent without grounding, and counts offsets in code points", () => {
    assert.isUndefined(richEnvelope("plain [1]", { sources: [] }))
    const rich = richEnvelope("🚀🚀 [1]", {
      sources: [{ id: "1", title: "t", url: "https://example.org/", snippet: "" }]
    })!
    assert.deepStrictEqual(rich.annotations, [
      { type: "url_citation", start_index: 3, end_index: 6, source_ids: ["1"] }
    ])
  })
})
