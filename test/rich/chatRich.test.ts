import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import type { RichEnvelope } from "../../src/inference/Rich.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"

interface ChatBody {
  readonly choices: ReadonlyArray<{ message: { content: string } }>
  readonly svc_sources?: ReadonlyArray<{ id: string; url: string }>
  readonly svc: { readonly request_id: string; readonly rich?: RichEnvelope }
}
interface Chunk {
  readonly choices: ReadonlyArray<{ delta?: { content?: string }; finish_reason?: string | null }>
  readonly svc_sources?: ReadonlyArray<{ id: string; url: string }>
  readonly svc?: { readonly type: string; readonly rich?: RichEnvelope }
}

const slice = (text: string, start: number, end: number) => Array.from(text).slice(start, end).join("")

const grounded = (extra: Record<string, unknown> = {}) => ({
  model: "grounded-medium",
  max_tokens: 256,
  messages: [{ role: "user", content: "What moved the market today? [[sim:rich]]" }],
  ...extra
})

/** What every `svc.rich` of a `[[sim:rich]]` reply must say about `text`. */
const checkRich = (text: string, rich: RichEnvelope) => {
  assert.strictEqual(rich.version, 1)
  // Sources 4 (a metadata address) and 5 (credentials in the URL) never reach the caller.
  assert.deepStrictEqual(
    rich.sources.map((s) => s.id),
    ["1", "2", "3"]
  )
  for (const s of rich.sources) {
    assert.match(s.url, /^https:\/\/example\.org\//)
    assert.strictEqual(s.host, "example.org")
    assert.strictEqual(s.kind, "web")
  }
  const json = JSON.stringify(rich)
  assert.notInclude(json, "169.254")
  assert.notInclude(json, "secret@")
  const cited = [...text.matchAll(/\[([123])\]/g)].length
  assert.isAbove(cited, 0)
  assert.strictEqual(rich.annotations.length, cited, "every known marker and nothing else")
  for (const a of rich.annotations) {
    const marker = slice(text, a.start_index, a.end_index)
    assert.deepStrictEqual([marker], [`[${a.source_ids[0]}]`])
    assert.include(["1", "2", "3"], a.source_ids[0])
  }
  assert.include(text, "[9]")
  assert.deepStrictEqual(rich.blocks, [{ id: "sources", type: "source_list", source_ids: ["1", "2", "3"] }])
  assert.strictEqual(rich.block_refs.length, 1)
  const ref = rich.block_refs[0]!
  assert.strictEqual(ref.block_id, "sources")
  assert.strictEqual(slice(text, ref.start_index, ref.end_index), "[[rich:sources]]")
  assert.include(text, "[[rich:missing]]", "an unknown block stays plain text")
  assert.deepStrictEqual(rich.images, [])
  assert.deepStrictEqual(rich.places, [])
}

const dataFrames = (text: string) =>
  text
    .split("\n\n")
    .map((block) =>
      block
        .split("\n")
        .find((line) => line.startsWith("data: "))
        ?.slice(6)
    )
    .filter((data): data is string => data !== undefined && data !== "[DONE]")
    .map((data) => JSON.parse(data) as Chunk)

describe("svc.rich on chat completions", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("non-streaming: svc.rich in the body beside the provider's own svc_sources", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 5_000_000, balance: 5_000_000 })
        const r = yield* postJson("/v1/chat/completions", grounded(), { "x-credit-key": key.secret })
        assert.strictEqual(r.status, 200, r.text)
        const body = r.json as ChatBody
        const text = body.choices[0]!.message.content
        checkRich(text, body.svc.rich!)
        // Preserved as the provider sent it, unsafe entries included: svc.rich is the rendered view.
        assert.deepStrictEqual(
          body.svc_sources!.map((s) => s.id),
          ["1", "2", "3", "4", "5"]
        )

        const plain = yield* postJson(
          "/v1/chat/completions",
          { model: "chat-medium", max_tokens: 32, messages: [{ role: "user", content: "hello [1]" }] },
          { "x-credit-key": key.secret }
        )
        assert.strictEqual(plain.status, 200)
        assert.isUndefined((plain.json as ChatBody).svc.rich)
        assert.isUndefined((plain.json as ChatBody).svc_sources)
      })
    )

    it.effect(
      "streaming: an additive svc.rich frame before the first delta, the complete one before finish",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = yield* fundedKey({ budget: 5_000_000, balance: 5_000_000 })
          const r = yield* postJson("/v1/chat/completions", grounded({ stream: true }), {
            "x-credit-key": key.secret
          })
          assert.strictEqual(r.status, 200)
          const frames = dataFrames(r.text)
          const isContent = (f: Chunk) => (f.choices[0]?.delta?.content ?? "") !== ""
          const richAt = frames.flatMap((f, i) => (f.svc?.type === "rich" ? [i] : []))
          const contentAt = frames.flatMap((f, i) => (isContent(f) ? [i] : []))
          const finishAt = frames.findIndex((f) => (f.choices[0]?.finish_reason ?? null) !== null)
          assert.strictEqual(richAt.length, 2)
          assert.isAbove(contentAt.length, 5, "deltas stream one by one")
          assert.isBelow(richAt[0]!, contentAt[0]!)
          assert.isAbove(richAt[1]!, contentAt.at(-1)!)
          assert.isBelow(richAt[1]!, finishAt)
          const text = frames.map((f) => f.choices[0]?.delta?.content ?? "").join("")
          const first = frames[richAt[0]!]!
          assert.deepStrictEqual(
            first.svc_sources!.map((s) => s.id),
            ["1", "2", "3", "4", "5"]
          )
          assert.deepStrictEqual(first.svc!.rich!.annotations, [])
          assert.deepStrictEqual(
            first.svc!.rich!.sources.map((s) => s.id),
            ["1", "2", "3"]
          )
          const last = frames[richAt[1]!]!.svc!.rich!
          checkRich(text, last)

          // A reconnect from the middle of the stream ends with the same complete envelope.
          const id = r.headers.get("x-request-id")!
          const resumed = yield* call(`/v1/streams/${id}`, {
            headers: { "x-stream-token": r.headers.get("x-stream-token")!, "last-event-id": "3" }
          })
          assert.strictEqual(resumed.status, 200)
          const again = dataFrames(resumed.text).filter((f) => f.svc?.type === "rich")
          assert.deepStrictEqual(again.at(-1)!.svc!.rich, last)
        })
    )

    it.effect("/v1/responses projects the same citations into output_text.annotations", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const key = yield* fundedKey({ budget: 5_000_000, balance: 5_000_000 })
        const r = yield* postJson(
          "/v1/responses",
          {
            model: "grounded-medium",
            input: "What moved the market today? [[sim:rich]]",
            max_output_tokens: 256
          },
          { "x-credit-key": key.secret }
        )
        assert.strictEqual(r.status, 200, r.text)
        const body = r.json as {
          output: ReadonlyArray<{
            type: string
            content?: ReadonlyArray<{
              text: string
              annotations: ReadonlyArray<{ start_index: number; end_index: number; url: string }>
            }>
          }>
        }
        const part = body.output.find((o) => o.type === "message")!.content![0]!
        const known = [...part.text.matchAll(/\[([123])\]/g)].length
        assert.strictEqual(part.annotations.length, known)
        for (const a of part.annotations) {
          assert.match(slice(part.text, a.start_index, a.end_index), /^\[[123]\]$/)
          assert.match(a.url, /^https:\/\/example\.org\//)
        }
      })
    )
  })
})
