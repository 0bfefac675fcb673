import { Readable } from "node:stream"
import { Effect } from "effect"

/**
 * One encoded frame, many subscribers (docs/decisions.md D125, D233). A frame is encoded once by the
 * publisher and the same bytes are pushed, in one synchronous pass, into every subscriber's own bounded
 * stream, which the HTTP server pipes to that subscriber's socket: a subscriber holding `queue` frames
 * it has not taken is dropped (its stream ends after what it holds) and never slows the others. No fiber
 * runs per subscriber per frame, so nothing else the process does runs between two subscribers' writes.
 * Above `capacity` subscribers a new one is refused. A subscriber is registered and its release attached
 * in one synchronous step (nothing can interrupt between them), and released when its stream closes for
 * any reason (it ended, the caller hung up, it was dropped).
 */
export interface Fanout {
  /** Offers the frame to every subscriber; returns how many were dropped as too slow. */
  readonly publish: (frame: Uint8Array) => number
  /**
   * A new subscriber's byte stream, starting with `first`, or undefined when capacity is full. The
   * subscription is released when the stream closes.
   */
  readonly open: (first: Uint8Array | undefined) => Effect.Effect<Readable | undefined>
  /**
   * Ends every subscriber's stream after what it holds and refuses new ones from then on: the instance
   * is shutting down, and a subscriber should reconnect to another (its events are not paid work, so
   * the drain does not wait for them).
   */
  readonly close: () => void
  readonly size: () => number
  readonly capacity: number
}

export const makeFanout = (options: { readonly capacity: number; readonly queue: number }): Fanout => {
  const subscribers = new Set<Readable>()
  let closed = false

  /** Ends a subscriber's stream after what it holds. */
  const drop = (stream: Readable) => {
    if (subscribers.delete(stream)) stream.push(null)
  }

  const publish = (frame: Uint8Array) => {
    let dropped = 0
    for (const stream of subscribers) {
      // `push` is false once the stream holds `queue` frames its socket has not taken.
      if (!stream.push(frame)) {
        drop(stream)
        dropped += 1
      }
    }
    return dropped
  }

  const open = (first: Uint8Array | undefined) =>
    Effect.sync(() => {
      if (closed || subscribers.size >= options.capacity) return undefined
      const stream = new Readable({ objectMode: true, highWaterMark: options.queue, read() {} })
      if (first !== undefined) stream.push(first)
      subscribers.add(stream)
      // Released when the stream closes: it ended, the caller hung up (the server destroys it) or it was dropped.
      stream.once("close", () => subscribers.delete(stream))
      return stream
    })

  const close = () => {
    closed = true
    for (const stream of subscribers) drop(stream)
  }

  return { publish, open, close, size: () => subscribers.size, capacity: options.capacity }
}
