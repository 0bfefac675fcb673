import { Effect } from "effect"
import { HttpServerResponse } from "effect/http"
import type { Indexed, KeptReply, LiveStream, LiveStreams } from "../inference/LiveStreams.ts"
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
 * A served reply while its stream runs: the reply, and once an SSE reader or the keeper needs it, its
 * SSE as written, encoded once (D350). Its dialect's encoder takes every event in order, from the first,
 * as it is published; the bytes of the opening frames and of each event's frames are what every SSE
 * reader sends (the original response, a resume while it runs) and what the stream keeps when it
 * finishes, so a replay is the bytes the caller got.
 */
export interface Writing {
  readonly reply: Reply
  encoder: FrameEncoder | undefined
  opening: Uint8Array | undefined
  /** The bytes of each event encoded so far, by index (none: the event writes no frame). */
  readonly frames: Array<Uint8Array | undefined>
  /** Where each encoded event's bytes begin, after the opening's. */
  readonly offsets: Array<number>
  length: number
}

export const writing = (reply: Reply): Writing => ({
  reply,
  encoder: undefined,
  opening: undefined,
  frames: [],
  offsets: [],
  length: 0
})

const bytesOf = (frames: ReadonlyArray<string>) =>
  frames.length === 0 ? undefined : utf8.encode(frames.length === 1 ? frames[0]! : frames.join(""))

/** The reply's encoder, its opening frames encoded (once, at the first need). */
const encoderOf = (written: Writing) => {
  if (written.encoder !== undefined) return written.encoder
  const encoder = written.reply.encoder()
  written.encoder = encoder
  written.opening = bytesOf(encoder.start())
  written.length = written.opening?.length ?? 0
  return encoder
}

const encodeNext = (written: Writing, encoder: FrameEncoder, event: ServeEvent | undefined) => {
  const index = written.frames.length
  // Past the stream's buffer bound an event no reader took is not there to encode (LiveStreams).
  const bytes = event === undefined ? undefined : bytesOf(encoder.push(event, index))
  written.offsets.push(written.length)
  written.frames.push(bytes)
  if (bytes !== undefined) written.length += bytes.length
}

/**
 * The bytes of event `indexed` (of the stream's `events`), encoding first, in order, every event before
 * it that no reader needed yet; encoded once, whichever reader asks first.
 */
const framesOf = (written: Writing, events: ReadonlyArray<ServeEvent>, indexed: Indexed<ServeEvent>) => {
  const encoder = encoderOf(written)
  while (written.frames.length < indexed.index) encodeNext(written, encoder, events[written.frames.length])
  if (written.frames.length === indexed.index) encodeNext(written, encoder, indexed.event)
  return written.frames[indexed.index]
}

/**
 * What the stream keeps when it finished: the SSE bytes as written (every event encoded, in one buffer
 * of its own, with the offset of each event's first frame: a resume from any event is a slice), or the
 * JSON body.
 */
export const keptReply = (written: Writing, events: ReadonlyArray<ServeEvent>): KeptReply => {
  const reply = written.reply
  if (!reply.streaming) {
    return {
      contentType: JSON_TYPE,
      headers: reply.headers,
      body: utf8.encode(JSON.stringify(reply.body(events))),
      offsets: undefined
    }
  }
  const encoder = encoderOf(written)
  while (written.frames.length < events.length) encodeNext(written, encoder, events[written.frames.length])
  const { frames, opening } = written
  const body = new Uint8Array(written.length)
  if (opening !== undefined) body.set(opening)
  const offsets = new Uint32Array(frames.length + 1)
  for (let i = 0; i < frames.length; i++) {
    offsets[i] = written.offsets[i]!
    const bytes = frames[i]
    if (bytes !== undefined) body.set(bytes, offsets[i])
  }
  offsets[frames.length] = written.length
  return { contentType: SSE, headers: sseHeaders(reply.headers), body, offsets }
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
 * its kept bytes; otherwise it sends the reply's frames as written (D350) from `from` on.
 */
export const respondLive = (live: LiveStreams["Service"], written: Writing, from: number) =>
  Effect.suspend(() => {
    const reply = written.reply
    const stream = reply.stream
    if (stream.kept !== undefined) return Effect.succeed(keptResponse(stream.kept, from))
    if (reply.streaming || from > 0) {
      // Written as each event is published (LiveStreams `follow` with a reader): the response's body
      // is one stream stage while it waits (D306).
      encoderOf(written)
      const opening = from === 0 ? written.opening : undefined
      const body = live.follow(stream, from, {
        opening: opening === undefined ? [] : [opening],
        // Every event is written (the keeper keeps them all); this reader sends those from `from` on.
        map: (indexed) => {
          const bytes = framesOf(written, stream.events, indexed)
          return indexed.index >= from ? bytes : undefined
        },
        // Compacted between the response and its first read: nothing went out yet (D462).
        compacted: (kept) => [keptBody(kept, from)]
      })
      return Effect.succeed(
        HttpServerResponse.stream(body, { contentType: SSE, headers: sseHeaders(reply.headers) })
      )
    }
    // The events are not read here: when the work ends, its keeper writes this very body (D324). The
    // wait holds the work as a reader (a hang-up still stops it) with no stream of its own (D471).
    return Effect.map(live.awaitEnd(stream), () =>
      stream.kept !== undefined
        ? keptResponse(stream.kept, 0)
        : HttpServerResponse.jsonUnsafe(reply.body(stream.events), { headers: reply.headers })
    )
  })
