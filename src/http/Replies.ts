import { Effect, Stream } from "effect"
import { HttpServerResponse } from "effect/http"
import type { KeptReply, LiveStream, LiveStreams } from "../inference/LiveStreams.ts"
import type { ServeEvent } from "../inference/Paid.ts"

/**
 * How a served request is written in its caller's dialect: live (SSE or a whole body, from any event
 * on) while it runs, and once, when it finishes, as the bytes its stream keeps for replay (D270).
 */

/** A dialect's SSE encoder for one reply: its opening frames, then the frames of each event in order. */
export interface FrameEncoder {
  start(): ReadonlyArray<string>
  push(event: ServeEvent, index: number): ReadonlyArray<string>
}

/** One served request's reply, as its dialect writes it. */
export interface Reply {
  readonly stream: LiveStream<ServeEvent>
  /** Whether the caller asked for SSE (otherwise one JSON body). */
  readonly streaming: boolean
  readonly headers: Record<string, string>
  readonly encoder: () => FrameEncoder
  readonly body: (events: ReadonlyArray<ServeEvent>) => unknown
}

/**
 * Kept bytes get an ArrayBuffer of their own, of their exact size: `Buffer.from` puts a short string in
 * Node's shared 8 KB pool, and a kept slice of the pool would keep the whole slab for ten minutes.
 */
const utf8 = new TextEncoder()

const SSE = "text/event-stream"
const JSON_TYPE = "application/json"
const sseHeaders = (headers: Record<string, string>) => ({ ...headers, "cache-control": "no-cache" })

/**
 * The reply's bytes, written once when its stream finished: the SSE frames of every event concatenated
 * with the offset of each event's first frame (a resume from any event is a slice), or the JSON body.
 */
export const keptReply = (reply: Reply, events: ReadonlyArray<ServeEvent>): KeptReply => {
  if (!reply.streaming) {
    return {
      contentType: JSON_TYPE,
      headers: reply.headers,
      body: utf8.encode(JSON.stringify(reply.body(events))),
      offsets: undefined
    }
  }
  const encoder = reply.encoder()
  const parts: Array<string> = [...encoder.start()]
  const offsets = new Uint32Array(events.length + 1)
  let length = 0
  for (const part of parts) length += Buffer.byteLength(part)
  for (let i = 0; i < events.length; i++) {
    offsets[i] = length
    for (const frame of encoder.push(events[i]!, i)) {
      parts.push(frame)
      length += Buffer.byteLength(frame)
    }
  }
  offsets[events.length] = length
  return { contentType: SSE, headers: sseHeaders(reply.headers), body: utf8.encode(parts.join("")), offsets }
}

/**
 * The kept bytes from event `from` on, with the opening frames only from the start unless they were
 * sent already (a whole body is answered whole).
 */
const keptBody = (kept: KeptReply, from: number, openingSent = false) =>
  kept.offsets === undefined || (from <= 0 && !openingSent)
    ? kept.body
    : kept.body.subarray(kept.offsets[Math.min(Math.max(from, 0), kept.offsets.length - 1)]!)

export const keptResponse = (kept: KeptReply, from: number) =>
  HttpServerResponse.uint8Array(keptBody(kept, from), {
    contentType: kept.contentType,
    headers: kept.headers
  })

/**
 * The reply from event `from` on (0: from the start, with the opening frames): SSE when the caller
 * streams or resumes, else the whole body. A reader that comes after the stream was compacted reads
 * its kept bytes; the encoder otherwise replays from the first event and sends what follows `from`.
 */
export const respondLive = (live: LiveStreams["Service"], reply: Reply, from: number) =>
  Effect.gen(function* () {
    const stream = reply.stream
    if (stream.kept !== undefined) return keptResponse(stream.kept, from)
    if (reply.streaming || from > 0) {
      // Encoded as each event is published (LiveStreams `follow` with a reader): the response's body
      // is one stream stage while it waits (D306).
      const encoder = reply.encoder()
      const bytesOf = (frames: ReadonlyArray<string>) =>
        frames.length === 0 ? undefined : utf8.encode(frames.length === 1 ? frames[0]! : frames.join(""))
      const opening = from === 0 ? bytesOf(encoder.start()) : undefined
      const body = live
        .follow(stream, 0, {
          opening: opening === undefined ? [] : [opening],
          map: ({ event, index }) => {
            const frames = encoder.push(event, index)
            return index >= from ? bytesOf(frames) : undefined
          }
        })
        .pipe(
          // Compacted between the response and its first read: nothing went out yet.
          Stream.catchTag("Compacted", () => Stream.make(keptBody(stream.kept!, from)))
        )
      return HttpServerResponse.stream(body, { contentType: SSE, headers: sseHeaders(reply.headers) })
    }
    return yield* Stream.runCollect(live.follow(stream, 0)).pipe(
      Effect.map((events) =>
        // The work ended, and its keeper wrote this very body then (the same bytes): sent as kept,
        // not assembled and serialized a second time (D324).
        stream.kept !== undefined
          ? keptResponse(stream.kept, 0)
          : HttpServerResponse.jsonUnsafe(reply.body(events.map((e) => e.event)), { headers: reply.headers })
      ),
      Effect.catchTag("Compacted", () => Effect.succeed(keptResponse(stream.kept!, from)))
    )
  })
