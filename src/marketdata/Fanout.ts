import { type Cause, Effect, Exit, Queue, Scope, Stream } from "effect"

/**
 * One encoded frame, many subscribers (docs/decisions.md D125). A frame is encoded once by the publisher
 * and the same bytes are offered to every subscriber's own bounded queue without waiting: a subscriber
 * whose queue is full is dropped (its queue ends, so its stream ends after what it holds) and never
 * slows the others. Above `capacity` subscribers a new one is refused. A subscriber is a scoped
 * resource: registered and its release attached in one uninterruptible step, released when its stream
 * ends, is interrupted (the caller hung up) or is dropped.
 */
export interface Fanout {
  /** Offers the frame to every subscriber; returns how many were dropped as too slow. */
  readonly publish: (frame: Uint8Array) => number
  /**
   * A new subscriber's stream, starting with `first`, or undefined when capacity is full. The
   * subscription is released when the stream ends for any reason.
   */
  readonly open: (first: Uint8Array | undefined) => Effect.Effect<Stream.Stream<Uint8Array> | undefined>
  readonly size: () => number
  readonly capacity: number
}

export const makeFanout = (options: { readonly capacity: number; readonly queue: number }): Fanout => {
  const subscribers = new Set<Queue.Queue<Uint8Array, Cause.Done>>()

  const drop = (queue: Queue.Queue<Uint8Array, Cause.Done>) => {
    subscribers.delete(queue)
    Queue.endUnsafe(queue)
  }

  const publish = (frame: Uint8Array) => {
    let dropped = 0
    for (const queue of subscribers) {
      if (!Queue.offerUnsafe(queue, frame)) {
        drop(queue)
        dropped += 1
      }
    }
    return dropped
  }

  /** Registers a subscriber in `scope`; the scope's close releases it. */
  const subscribe = (scope: Scope.Scope, first: Uint8Array | undefined) =>
    Effect.acquireRelease(
      Effect.gen(function* () {
        if (subscribers.size >= options.capacity) return undefined
        const queue = yield* Queue.bounded<Uint8Array, Cause.Done>(options.queue)
        if (first !== undefined) Queue.offerUnsafe(queue, first)
        subscribers.add(queue)
        return queue
      }),
      (queue) =>
        Effect.sync(() => {
          if (queue !== undefined) drop(queue)
        })
    ).pipe(Scope.provide(scope))

  const open = (first: Uint8Array | undefined) =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const queue = yield* subscribe(scope, first)
      if (queue === undefined) {
        yield* Scope.close(scope, Exit.void)
        return undefined
      }
      return Stream.fromQueue(queue).pipe(Stream.ensuring(Scope.close(scope, Exit.void)))
    }).pipe(Effect.uninterruptible)

  return { publish, open, size: () => subscribers.size, capacity: options.capacity }
}
