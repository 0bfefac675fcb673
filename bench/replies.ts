/**
 * `npm run bench:replies`: the router's CPU to write one paid chat reply, timed in process through the
 * real code (`LiveStreams`, `http/Replies.ts`, the chat encoder): a stream started and published into,
 * the caller's response read to its end, the finished stream compacted into its kept replay.
 *
 * Replies: `short` is what `bench:load`'s mock answers (two text deltas, then the end), `long` 200
 * deltas; each streamed (SSE) and whole (JSON). The auction has two bids, as in `bench:load`.
 * `BENCH_BASE=/path/to/a/checkout` times that checkout's `LiveStreams` and `Replies` in the same
 * process, alternated with this one's (an A/B on one machine at one time). Prints the main thread's
 * CPU per reply, each block timed from a collected heap; asserts nothing. Knobs: BENCH_REPLIES (per
 * timed block, default 2,000), BENCH_ROUNDS (default 5). Then the memory a held-open streamed reply
 * takes in the same code (its work waiting after the first event, its response read up to there):
 * BENCH_HELD replies (default 2,000; 0 skips it), twice per checkout.
 */
import { join, resolve } from "node:path"
import { Context, Deferred, Effect, Layer, Schema, Stream } from "effect"
import type { HttpServerResponse } from "effect/http"
import { SignedQuote } from "../src/domain/Quote.ts"
import * as ThisReplies from "../src/http/Replies.ts"
import { assemble, chatCompletionBody, makeChatEncoder, paidHeaders } from "../src/inference/ChatEncoding.ts"
import { LiveStreams as ThisLiveStreams } from "../src/inference/LiveStreams.ts"
import type { Admitted, ServeEvent, ServeSummary } from "../src/inference/Paid.ts"
import { type AuctionCleared, runAuction } from "../src/market/Auction.ts"
import { defaultCatalog } from "../src/market/Catalog.ts"

const REPLIES = Number(process.env.BENCH_REPLIES ?? 2_000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5)
const BASE = process.env.BENCH_BASE
const HELD = Number(process.env.BENCH_HELD ?? 2_000)

const nowMs = Date.now()
const quote = (provider: string, priceIn: number, priceOut: number) =>
  Schema.decodeUnknownSync(SignedQuote)({
    quote_id: `q-${provider}`,
    provider_id: provider,
    model_class: "chat-small",
    price_in: priceIn,
    price_out: priceOut,
    max_context: 32_000,
    valid_until: Math.floor(nowMs / 1000) + 3600,
    capacity_rps: 1_000,
    sig: `0x${"ab".repeat(65)}`
  })
const outcome = runAuction(
  { requested: "chat-small", promptTokens: 12, maxTokens: 16, nowMs },
  [quote("bench-a", 100_000, 400_000), quote("bench-b", 110_000, 440_000)].map((q) => ({
    quote: q,
    inFlight: 0
  })),
  defaultCatalog,
  () => ({ quantile: () => 300, maturity: "mature" })
)
if (outcome._tag !== "Cleared") throw new Error(`the bench's auction did not clear: ${outcome._tag}`)
const auction = outcome as AuctionCleared

const summary: ServeSummary = {
  status: "ok",
  finishReason: "stop",
  providerId: "bench-a",
  modelClass: "chat-small",
  usage: {
    promptTokens: 12,
    completionTokens: 5,
    reasoningTokens: 0,
    cachedTokens: 0,
    estimated: { prompt: false, completion: false, reasoning: false }
  },
  charged: 3_200,
  authorized: 7_600,
  ttftMs: 1,
  error: null
}
const text = (t: string): ServeEvent => ({ _tag: "Delta", event: { _tag: "TextDelta", text: t } })
const shapes = {
  short: [text("Hello"), text(" from the mock."), { _tag: "End", summary }],
  long: [...Array.from({ length: 200 }, (_, i) => text(` token${i}`)), { _tag: "End", summary }]
} satisfies Record<string, ReadonlyArray<ServeEvent>>

/** What a checkout's replies module offers (before D350 `respondLive` and `keptReply` took the reply itself). */
interface RepliesModule {
  readonly respondLive: (
    live: never,
    written: never,
    from: number
  ) => Effect.Effect<HttpServerResponse.HttpServerResponse>
  readonly keptReply: (written: never, events: ReadonlyArray<ServeEvent>) => unknown
  readonly writing?: (reply: ThisReplies.Reply) => unknown
}

interface Variant {
  readonly name: string
  readonly replies: RepliesModule
  readonly live: ThisLiveStreams["Service"]
}

/** A checkout's `LiveStreams`, built in the bench's scope (its works are forked into that scope). */
const liveStreamsOf = (tag: typeof ThisLiveStreams, layer: Layer.Layer<ThisLiveStreams>) =>
  Effect.map(Layer.build(layer), (context) => Context.get(context, tag))

let served = 0

/**
 * One paid reply: the work publishes its first event before the response is written (admission waits
 * for it). A held reply's work waits for `release` after its first event, and its response is read in a
 * fiber of its own.
 */
const writeOne = (
  variant: Variant,
  events: ReadonlyArray<ServeEvent>,
  streaming: boolean,
  release?: Deferred.Deferred<void>
) =>
  Effect.gen(function* () {
    const { live, replies } = variant
    const requestId = `req_${variant.name}_${++served}`
    const { stream, token } = yield* live.start<ServeEvent>(requestId, (publish) =>
      Effect.gen(function* () {
        publish(events[0]!)
        yield* release === undefined ? Effect.yieldNow : Deferred.await(release)
        for (let i = 1; i < events.length; i++) publish(events[i]!)
      })
    )
    const admitted: Admitted = {
      requestId,
      createdAt: nowMs,
      request: { model: "chat-small", messages: [{ role: "user", content: "Say hello." }], max_tokens: 16 },
      auction,
      funding: { _tag: "Credit", keyId: "key_bench", wallet: "0xbench", keyRemaining: 1_000_000 },
      stream,
      streamToken: token,
      sessionToken: undefined
    }
    const reply: ThisReplies.Reply = {
      stream,
      streaming,
      headers: paidHeaders(admitted, {}, "eip155:31337"),
      encoder: () => makeChatEncoder(admitted, false),
      body: (all) => chatCompletionBody(admitted, assemble(all), false)
    }
    const written = (replies.writing?.(reply) ?? reply) as never
    live.keep(stream, (all) => replies.keptReply(written, all) as never)
    const response = yield* replies.respondLive(live as never, written, 0)
    if (response.body._tag !== "Stream") return
    const read = Stream.runDrain(response.body.stream).pipe(Effect.orDie)
    if (release === undefined) yield* read
    else yield* Effect.forkScoped(read)
  })

/** Heap and array buffers in use, after a full collection (bytes). */
const memoryInUse = () => {
  collect()
  const { heapUsed, arrayBuffers } = process.memoryUsage()
  return heapUsed + arrayBuffers
}

/** Memory per held-open streamed reply (after its first event), `BENCH_HELD` of them at once. */
const heldKb = (variant: Variant, count: number) =>
  Effect.gen(function* () {
    const release = yield* Deferred.make<void>()
    const before = memoryInUse()
    for (let i = 0; i < count; i++) yield* writeOne(variant, shapes.short, true, release)
    yield* Effect.sleep("50 millis")
    const during = memoryInUse()
    yield* Deferred.succeed(release, undefined)
    yield* Effect.sleep("50 millis")
    return (during - before) / 1024 / count
  }).pipe(Effect.scoped)

/** The main thread's CPU (the router's one thread; collector helper threads not counted). */
const cpuMs = () => {
  const { user, system } = process.threadCpuUsage()
  return (user + system) / 1000
}

/** Each block starts from a collected heap (with `--expose-gc`, as `npm run bench:replies` runs). */
const collect = (globalThis as { gc?: () => void }).gc ?? (() => {})

const timeBlock = (variant: Variant, events: ReadonlyArray<ServeEvent>, streaming: boolean) =>
  Effect.gen(function* () {
    collect()
    const before = cpuMs()
    for (let i = 0; i < REPLIES; i++) yield* writeOne(variant, events, streaming)
    return ((cpuMs() - before) * 1000) / REPLIES
  })

const median = (values: ReadonlyArray<number>) =>
  [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

const main = Effect.gen(function* () {
  const variants: Array<Variant> = [
    {
      name: "this",
      replies: ThisReplies as RepliesModule,
      live: yield* liveStreamsOf(ThisLiveStreams, ThisLiveStreams.layer)
    }
  ]
  if (BASE !== undefined) {
    const root = resolve(BASE)
    const baseReplies = (yield* Effect.promise(
      () => import(join(root, "src/http/Replies.ts"))
    )) as RepliesModule
    const baseLive = (yield* Effect.promise(() => import(join(root, "src/inference/LiveStreams.ts")))) as {
      LiveStreams: typeof ThisLiveStreams
    }
    const live = yield* liveStreamsOf(baseLive.LiveStreams, baseLive.LiveStreams.layer)
    variants.unshift({ name: "base", replies: baseReplies, live })
  }
  const cases = [
    { shape: "short", streaming: true },
    { shape: "short", streaming: false },
    { shape: "long", streaming: true }
  ] as const
  // Warm-up: every path through the JIT before anything is timed.
  for (const variant of variants) {
    for (const c of cases)
      for (let i = 0; i < 500; i++) yield* writeOne(variant, shapes[c.shape], c.streaming)
  }
  const results = new Map<string, Array<number>>()
  for (let round = 0; round < ROUNDS; round++) {
    for (const c of cases) {
      for (const variant of round % 2 === 0 ? variants : [...variants].reverse()) {
        const perReply = yield* timeBlock(variant, shapes[c.shape], c.streaming)
        const key = `${c.shape} ${c.streaming ? "SSE " : "JSON"} ${variant.name}`
        results.set(key, [...(results.get(key) ?? []), perReply])
      }
    }
  }
  if (HELD > 0) {
    for (let round = 0; round < 2; round++) {
      for (const variant of round % 2 === 0 ? variants : [...variants].reverse()) {
        const key = `held SSE   ${variant.name}`
        results.set(key, [...(results.get(key) ?? []), yield* heldKb(variant, HELD)])
      }
    }
  }
  const lines = [...results].map(([key, values]) =>
    key.startsWith("held")
      ? `${key.padEnd(16)} ${values.map((v) => v.toFixed(2)).join(" / ")} KB heap and array buffers per held reply (${HELD} held)`
      : `${key.padEnd(16)} ${median(values).toFixed(1).padStart(7)} µs CPU per reply (median of ${values.length}; ${values.map((v) => v.toFixed(0)).join(" ")})`
  )
  process.stdout.write(`${REPLIES} replies per block, ${ROUNDS} rounds\n${lines.join("\n")}\n`)
})

Effect.runPromise(Effect.scoped(main)).catch((error) => {
  process.stderr.write(`${error}\n`)
  process.exit(1)
})
