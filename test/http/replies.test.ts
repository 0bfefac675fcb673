import { assert, describe, layer } from "@effect/vitest"
import { Effect, Fiber, Queue, Stream } from "effect"
import type { HttpServerResponse } from "effect/http"
import { TestClock } from "effect/testing"
import { keptReply, keptResponse, type Reply, respondLive, writing } from "../../src/http/Replies.ts"
import { LiveStreams } from "../../src/inference/LiveStreams.ts"
import type { ServeEvent } from "../../src/inference/Paid.ts"

/**
 * A streamed reply is encoded once (D350): the bytes its caller got, a resume's and the kept replay
 * are the same bytes. The encoder here writes its own serial number in every frame, so a second
 * encoding of the same events (by the keeper, or by a resuming reader) would not match.
 */

const text = (t: string): ServeEvent => ({ _tag: "Delta", event: { _tag: "TextDelta", text: t } })
const hidden = (t: string): ServeEvent => ({ _tag: "Delta", event: { _tag: "ReasoningDelta", text: t } })
const end: ServeEvent = {
  _tag: "End",
  summary: {
    status: "ok",
    finishReason: "stop",
    providerId: "prov-a",
    modelClass: "chat-small",
    usage: {
      promptTokens: 3,
      completionTokens: 4,
      reasoningTokens: 1,
      cachedTokens: 0,
      estimated: { prompt: false, completion: false, reasoning: false }
    },
    charged: 7,
    authorized: 9,
    ttftMs: 1,
    error: null
  }
}

/** Counts what it does: encoders made, events pushed. A hidden delta writes no frame. */
const countingEncoder = () => {
  const counts = { encoders: 0, pushes: 0 }
  const encoder = () => {
    const serial = ++counts.encoders
    return {
      start: () => [`data: {"opening":${serial}}\n\n`],
      push: (event: ServeEvent, index: number) => {
        counts.pushes++
        if (event._tag === "Delta" && event.event._tag === "ReasoningDelta") return []
        const body = event._tag === "End" ? "end" : event.event._tag === "TextDelta" ? event.event.text : "?"
        return [`id: ${index}\ndata: {"encoder":${serial},"text":"${body}"}\n\n`]
      }
    }
  }
  return { counts, encoder }
}

const bodyBytes = (response: HttpServerResponse.HttpServerResponse) => {
  const body = response.body
  if (body._tag === "Uint8Array") return Effect.succeed(body.body)
  if (body._tag !== "Stream") return Effect.die(`unexpected body ${body._tag}`)
  return Stream.runCollect(body.stream).pipe(
    Effect.orDie,
    Effect.map((chunks) => new Uint8Array(Buffer.concat(chunks)))
  )
}

const utf8 = (bytes: Uint8Array) => Buffer.from(bytes).toString("utf8")

/** A stream whose work publishes what the test sends it, and ends on `undefined`. */
const scripted = (id: string) =>
  Effect.gen(function* () {
    const live = yield* LiveStreams
    const script = yield* Queue.unbounded<ServeEvent | undefined>()
    const { stream } = yield* live.start<ServeEvent>(id, (publish) =>
      Effect.gen(function* () {
        while (true) {
          const next = yield* Queue.take(script)
          if (next === undefined) return
          publish(next)
        }
      })
    )
    const send = (...events: ReadonlyArray<ServeEvent | undefined>) =>
      Effect.forEach(events, (event) => Queue.offer(script, event), { discard: true })
    return { live, stream, send }
  })

describe("a streamed reply", () => {
  layer(LiveStreams.layer)((it) => {
    it.effect("is encoded once: the kept replay and a resume are the bytes the caller got", () =>
      Effect.gen(function* () {
        const { live, stream, send } = yield* scripted("req_replies_once")
        const { counts, encoder } = countingEncoder()
        const reply: Reply = {
          stream,
          streaming: true,
          headers: { "x-request-id": "req_replies_once" },
          encoder,
          body: () => ({})
        }
        // Two events are out before the reply is written (admission waits for the first token).
        yield* send(text("a"), hidden("think"))
        yield* Effect.yieldNow
        const written = writing(reply)
        live.keep(stream, (events) => keptReply(written, events))

        const original = yield* respondLive(live, written, 0).pipe(
          Effect.flatMap(bodyBytes),
          Effect.forkChild
        )
        yield* Effect.yieldNow
        yield* send(text("b"), text("c"))
        yield* Effect.yieldNow
        // A reconnect after event 2, while the work runs.
        const resumed = yield* respondLive(live, written, 3).pipe(Effect.flatMap(bodyBytes), Effect.forkChild)
        yield* Effect.yieldNow
        yield* send(hidden("more"), text("d"), end, undefined)
        const sent = yield* Fiber.join(original)
        const resumedLive = yield* Fiber.join(resumed)

        const kept = stream.kept
        assert.isDefined(kept, "the finished stream was not compacted")
        assert.strictEqual(utf8(kept!.body), utf8(sent), "the kept replay is not what the caller got")
        assert.include(utf8(sent), '{"encoder":1,"text":"d"}')
        assert.deepStrictEqual({ ...counts }, { encoders: 1, pushes: 7 }, "an event was encoded twice")

        // A resume after event 2: live and kept, the same bytes, the tail of what was sent.
        const resumedKept = yield* bodyBytes(keptResponse(kept!, 3))
        assert.strictEqual(utf8(resumedLive), utf8(resumedKept))
        assert.isTrue(utf8(sent).endsWith(utf8(resumedKept)))
        assert.isTrue(utf8(resumedKept).startsWith('id: 3\ndata: {"encoder":1,"text":"c"}'))
        assert.strictEqual(kept!.offsets!.length, 8)
        assert.strictEqual(kept!.offsets!.at(-1), kept!.body.length)
      })
    )

    it.effect(
      "a whole reply waits for the end as a reader: answered with the kept body; a hang-up stops the work",
      () =>
        Effect.gen(function* () {
          const whole = (id: string, stream: Reply["stream"]): Reply => ({
            stream,
            streaming: false,
            headers: { "x-request-id": id },
            encoder: countingEncoder().encoder,
            body: (events) => ({ events: events.length })
          })
          // Answered once the work ends, with the body its keeper wrote.
          const served = yield* scripted("req_replies_whole")
          const written = writing(whole("req_replies_whole", served.stream))
          // The keeper's body differs from one built from the events: a waiter told before the
          // compaction (which would answer from the events) reads `{ events: 2 }`, not this.
          served.live.keep(served.stream, (events) => ({
            ...keptReply(written, events),
            body: new TextEncoder().encode(JSON.stringify({ kept: events.length }))
          }))
          const waiting = yield* respondLive(served.live, written, 0).pipe(Effect.forkChild)
          yield* Effect.yieldNow
          assert.strictEqual(served.stream.readers.size, 1, "the wait is not a reader of the work")
          yield* served.send(text("a"), end, undefined)
          const response = yield* Fiber.join(waiting)
          assert.strictEqual(response.body._tag, "Uint8Array", "not answered with the kept body")
          const answered = yield* bodyBytes(response)
          assert.deepStrictEqual(JSON.parse(utf8(answered)), { kept: 2 })
          assert.strictEqual(served.stream.readers.size, 0)
          // After the end: answered at once.
          const late = yield* respondLive(served.live, written, 0).pipe(Effect.flatMap(bodyBytes))
          assert.strictEqual(utf8(late), utf8(answered))

          // The caller hangs up mid-work: its wait leaves, and the work is stopped after the grace period.
          const { stream: cut } = yield* served.live.start<ServeEvent>("req_replies_whole_cut", () =>
            Effect.interruptible(Effect.never)
          )
          const cutWait = yield* respondLive(
            served.live,
            writing(whole("req_replies_whole_cut", cut)),
            0
          ).pipe(Effect.forkChild)
          yield* Effect.yieldNow
          assert.strictEqual(cut.readers.size, 1)
          yield* Fiber.interrupt(cutWait)
          assert.strictEqual(cut.readers.size, 0)
          assert.isFalse(cut.stopRequested, "stopped before its grace period")
          yield* TestClock.adjust("600 millis")
          for (let i = 0; i < 20 && cut.finishedAt === undefined; i++) yield* Effect.yieldNow
          assert.isTrue(cut.stopRequested, "a hung-up whole reply did not stop its work")
          assert.isDefined(cut.finishedAt)
        })
    )

    // D462: a response made while the work ran, whose body is first read after the stream was
    // compacted, reads the kept bytes (from its `from`), with no stream stage of its own catching it.
    it.effect("a response first read after the stream was compacted sends the kept bytes", () =>
      Effect.gen(function* () {
        const { live, stream, send } = yield* scripted("req_replies_late_read")
        const { encoder } = countingEncoder()
        const reply: Reply = { stream, streaming: true, headers: {}, encoder, body: () => ({}) }
        yield* send(text("a"))
        yield* Effect.yieldNow
        const written = writing(reply)
        live.keep(stream, (events) => keptReply(written, events))
        const fromStart = yield* respondLive(live, written, 0)
        const fromSecond = yield* respondLive(live, written, 1)
        yield* send(text("b"), end, undefined)
        yield* Effect.yieldNow
        const kept = stream.kept
        assert.isDefined(kept, "the finished stream was not compacted")
        assert.strictEqual(utf8(yield* bodyBytes(fromStart)), utf8(kept!.body))
        const second = utf8(yield* bodyBytes(fromSecond))
        assert.isTrue(second.startsWith('id: 1\ndata: {"encoder":1,"text":"b"}'), second)
        assert.isTrue(utf8(kept!.body).endsWith(second))
      })
    )

    it.effect("whose keeper throws still finishes, keeps its events, and ends its readers", () =>
      Effect.gen(function* () {
        const { live, stream, send } = yield* scripted("req_replies_throws")
        live.keep(stream, () => {
          throw new Error("an encoder that throws")
        })
        const reader = yield* Stream.runCollect(live.follow(stream, 0)).pipe(Effect.forkChild)
        yield* Effect.yieldNow
        yield* send(text("a"), end, undefined)
        const read = yield* Fiber.join(reader)
        assert.deepStrictEqual(
          read.map((e) => e.index),
          [0, 1]
        )
        assert.isDefined(stream.finishedAt)
        assert.isUndefined(stream.fiber)
        assert.isUndefined(stream.kept)
        assert.strictEqual(yield* live.running, 0)
        // Not compacted: a later reader still reads the events.
        const again = yield* Stream.runCollect(live.follow(stream, 0))
        assert.strictEqual(again.length, 2)
      })
    )
  })
})
