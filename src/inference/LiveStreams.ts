import { createHash } from "node:crypto"
import type { Array as Arr } from "effect"
import {
  Cause,
  Channel,
  Clock,
  Config,
  Context,
  Data,
  Effect,
  Fiber,
  Layer,
  Schedule,
  Scope,
  Stream,
  Tracer
} from "effect"
import { randomText } from "../domain/RandomText.ts"
import { within } from "../process/Within.ts"
import { FinishedStreams, keptBytesOf } from "./FinishedStreams.ts"

/**
 * Served work runs detached from the HTTP connection, in a fiber this registry owns, and
 * publishes its events into a bounded in-memory buffer (the reply is never stored
 * anywhere else, and the buffer is dropped after `RETENTION_MS`, or sooner once the replies
 * finished since take more than the replay budget, D548). Any number of readers
 * follow it: the original response, a reconnect from a last event id, an idempotent
 * replay. When the last reader leaves before the work ends, the work is interrupted after
 * a short grace period, so a client that hangs up stops paying for tokens within a second.
 */
const GRACE = "500 millis"
const RETENTION_MS = 10 * 60 * 1000
/** The bytes of finished replies a process keeps for replay (`STREAM_REPLAY_MB`), the oldest let go first (D548). */
export const DEFAULT_REPLAY_MB = 64
/**
 * The longest a read of what a request settled (its receipt, its economics, a rating of its clear) waits for
 * the settlement of a request this process is still settling (`awaitDone`, D534).
 */
export const SETTLED_WAIT_MS = 5_000
/** Above the largest reply (`max_tokens` ≤ 131,072, about one event per token) with room to spare. */
const MAX_EVENTS = 300_000

export interface Indexed<E> {
  readonly index: number
  readonly event: E
}

/**
 * A finished reply as its caller's encoder wrote it: what a finished stream keeps for replay in place
 * of its events and the request they answered (D270).
 */
export interface KeptReply {
  readonly contentType: string
  readonly headers: Readonly<Record<string, string>>
  readonly body: Uint8Array
  /** Byte offset in `body` of each event's frames, and the body's length last (SSE); none for a whole body. */
  readonly offsets: Uint32Array | undefined
}

/** A reader came after the stream's events were replaced by its kept reply: read `stream.kept` instead. */
export class Compacted extends Data.TaggedError("Compacted")<{}> {}

/**
 * How a reader takes the events: `map` turns each (from the first, in order) into what it reads, or
 * nothing to skip it, and `opening` comes before them. Done as the event is published, so a reader that
 * encodes (a reply being written) needs no stream stages of its own while it waits (D306).
 */
export interface ReaderOptions<E, A> {
  readonly opening?: ReadonlyArray<A>
  readonly map: (indexed: Indexed<E>) => A | undefined
  /**
   * What the reader reads instead of failing with `Compacted` when it came after the stream's events
   * were replaced by its kept reply: done in the same step, so a reply needs no stream stage of its
   * own to catch it (D462).
   */
  readonly compacted?: (kept: KeptReply) => ReadonlyArray<A>
}

/**
 * A reader: a buffer its stream's events are handed to (`Buffered`), or a waiter that takes no event and
 * is told the end (`awaitEnd`: a whole reply waits for it without a buffer, a stream or a fiber of its
 * own, D471).
 */
type Reader = Buffered | Waiter
class Waiter {
  readonly end: () => void
  constructor(end: () => void) {
    this.end = end
  }
}
type ReaderMap<E> = (indexed: Indexed<E>) => unknown

/**
 * A streamed reader's items handed to it and not taken yet, and its pull waiting for more: its own,
 * not a `Queue` (whose three `Set`s of takers, offers and awaiters a reader never uses, D463).
 */
interface Buffered {
  pending: Array<unknown>
  ended: boolean
  failure: Compacted | undefined
  wake: (() => void) | undefined
}

const offer = (reader: Buffered, item: unknown) => {
  reader.pending.push(item)
  reader.wake?.()
}

const endReader = (reader: Buffered) => {
  reader.ended = true
  reader.wake?.()
}

/**
 * The reader's next items, all it has; once it has none and ended, `Cause.done`. A reader told of more
 * while it waits yields first, as a queue's taker is resumed through the scheduler: it never runs inside
 * the publishing fiber's step (the work's publish or its finish).
 */
const pullOf = (reader: Buffered) => {
  const woken = Effect.andThen(
    Effect.yieldNow,
    Effect.suspend(() => pull)
  )
  const pull: Effect.Effect<Arr.NonEmptyReadonlyArray<unknown>, Compacted | Cause.Done> = Effect.suspend(
    () => {
      if (reader.pending.length > 0) {
        const items = reader.pending as Arr.NonEmptyArray<unknown>
        reader.pending = []
        return Effect.succeed(items)
      }
      if (reader.failure !== undefined) return Effect.fail(reader.failure)
      if (reader.ended) return Cause.done()
      // One parameter: a register taking the abort signal would get an AbortController per wait.
      return Effect.callback<Arr.NonEmptyReadonlyArray<unknown>, Compacted | Cause.Done>((resume) => {
        reader.wake = () => {
          reader.wake = undefined
          resume(woken)
        }
        return Effect.sync(() => {
          reader.wake = undefined
        })
      })
    }
  )
  return pull
}

const takesNothing = () => undefined

const asIndexed = <E>(indexed: Indexed<E>) => indexed

export interface LiveStream<E> {
  readonly id: string
  readonly tokenHash: string
  /** Every event while the work runs; emptied when it finishes and a keeper turned them into `kept`. */
  events: Array<E>
  /** The live readers, each with what it makes of an event. */
  readonly readers: Map<Reader, ReaderMap<E>>
  fiber: Fiber.Fiber<void> | undefined
  /**
   * When the stream's last event was published and its readers were told the end: when the work said
   * so (`end`, D534), or when it ended without saying. The work may still be finishing (`done`).
   */
  finishedAt: number | undefined
  /** The work's fiber has ended (what it held is let go). */
  done: boolean
  /** Told once the work's fiber has ended (`awaitDone`). */
  whenDone: Array<() => void> | undefined
  stopRequested: boolean
  /** Turns the events into the kept reply when the work finishes (registered by `keep`). */
  keeper: ((events: ReadonlyArray<E>) => KeptReply) | undefined
  kept: KeptReply | undefined
}

/** Replaces a finished stream's events by its kept reply; the keeper (and what it closed over) goes. */
const compact = <E>(stream: LiveStream<E>) => {
  const keeper = stream.keeper
  if (keeper === undefined || stream.finishedAt === undefined) return
  stream.keeper = undefined
  stream.kept = keeper(stream.events)
  stream.events = []
}

/**
 * Runs `self` in `services` (a layer's context, shared by every request) instead of the caller's
 * context, keeping the caller's span as the parent of what it traces. For a piece of a request that
 * outlives its step: a fiber forked in it, or a finalizer registered in it (`acquireRelease` keeps the
 * context it ran in for its release), holds that context as long as it lives, and a request's context
 * is flattened, once read enough, into a copy of the whole service map (D460).
 */
export const inServices =
  (services: Context.Context<never>) =>
  <A, E>(self: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.updateContext(self, (caller: Context.Context<never>) => {
      const span = Context.getOrUndefined(caller, Tracer.ParentSpan)
      return span === undefined ? services : Context.add(services, Tracer.ParentSpan, span)
    })

export const hashToken = (token: string) => createHash("sha256").update(token).digest("hex")

export class LiveStreams extends Context.Service<
  LiveStreams,
  {
    /**
     * Starts `work` detached; it receives `publish` (an event to the stream, at once: a work may publish
     * several in one step, D565) and `end`. `work` runs uninterruptibly except where it
     * says otherwise (`Effect.interruptible`), so its finalization always runs. `end` says the last event
     * was published: the readers are told the end then, while the work may go on finishing (D534); a
     * work that never says it ends its stream when it ends. Returns the stream and its capability token
     * (returned to the caller once, stored only as a hash).
     */
    readonly start: <E>(
      id: string,
      work: (publish: (event: E) => void, end: Effect.Effect<void>) => Effect.Effect<void>
    ) => Effect.Effect<{ readonly stream: LiveStream<E>; readonly token: string }>
    readonly get: <E>(id: string) => LiveStream<E> | undefined
    /**
     * Events from index `from` on, live until the stream ends; fails with `Compacted` (before any event)
     * once a finished stream's events were replaced by its kept reply.
     */
    readonly follow: {
      <E>(stream: LiveStream<E>, from: number): Stream.Stream<Indexed<E>, Compacted>
      <E, A>(stream: LiveStream<E>, from: number, reader: ReaderOptions<E, A>): Stream.Stream<A, Compacted>
    }
    /**
     * Waits for the work to end, holding it as a reader that takes no event (a hang-up still stops it,
     * after the grace period, when it was the last reader); at once if it has ended.
     */
    readonly awaitEnd: <E>(stream: LiveStream<E>) => Effect.Effect<void>
    /**
     * Waits, at most `millis`, until the work of request `id` served by this process has ended (what it
     * settles is written), once its stream has ended; at once when there is none, it has ended, or it is
     * still being served. For reads of what a request settled, made after its reply: the reply can precede
     * the settlement's commit (D534).
     */
    readonly awaitDone: (id: string, millis: number) => Effect.Effect<void>
    /**
     * What a finished stream keeps: when the stream ends (at once if it has), `keeper` turns its events
     * into the kept reply, and the events and `keeper` are let go.
     */
    readonly keep: <E>(stream: LiveStream<E>, keeper: (events: ReadonlyArray<E>) => KeptReply) => void
    readonly stop: <E>(stream: LiveStream<E>) => Effect.Effect<void>
    /** How many works are still running, a stream ended or not (shutdown waits for them to end). */
    readonly running: Effect.Effect<number>
    /** Stops every running work and waits until each has settled and told its readers (shutdown). */
    readonly stopAll: Effect.Effect<void>
    readonly verify: <E>(stream: LiveStream<E>, token: string | undefined) => boolean
  }
>()("router/inference/LiveStreams") {
  static readonly layer = Layer.unwrap(
    // A value that is not an integer stops the start, naming the variable.
    Config.Int("STREAM_REPLAY_MB").pipe(
      Config.withDefault(DEFAULT_REPLAY_MB),
      Effect.orDie,
      Effect.map((megabytes) => LiveStreams.layerWithBudget(Math.max(0, megabytes) * 1024 * 1024))
    )
  )

  /** The registry keeping at most `replayBytes` of finished replies (and each at most `RETENTION_MS`). */
  static readonly layerWithBudget = (replayBytes: number) =>
    Layer.effect(LiveStreams, makeLiveStreams(replayBytes))
}

const makeLiveStreams = (replayBytes: number) =>
  Effect.gen(function* () {
    const streams = new Map<string, LiveStream<unknown>>()
    // Finished streams whose replies are kept, oldest first: past the budget the oldest whose work has ended
    // leave the registry (D548); the age sweep below takes what is older than `RETENTION_MS` either way.
    const finished = new FinishedStreams<LiveStream<unknown>>(replayBytes)
    const isDone = (stream: LiveStream<unknown>) => stream.done
    const drop = (stream: LiveStream<unknown>) => {
      if (streams.get(stream.id) === stream) streams.delete(stream.id)
    }
    /** Replaces a finished stream's events by its kept reply and counts what it keeps. */
    const compactAndCount = <E>(stream: LiveStream<E>) => {
      const counted = stream.kept !== undefined
      compact(stream)
      if (counted || stream.kept === undefined || stream.finishedAt === undefined) return
      finished.add(stream as LiveStream<unknown>, keptBytesOf(stream.kept), stream.finishedAt)
      finished.trim(isDone, drop)
    }
    const scope = yield* Effect.scope
    // What a work runs with: the services the router was built with, shared by every work, not the
    // context of the request that started it (D460).
    const detached = inServices(yield* Effect.context<never>())

    /** The stream's end, once: its readers are told, then it is compacted to its kept reply. */
    const finish = <E>(stream: LiveStream<E>) =>
      Effect.suspend(() => {
        if (stream.finishedAt !== undefined) return Effect.void
        return Effect.gen(function* () {
          stream.finishedAt = yield* Clock.currentTimeMillis
          // A waiter is told after the compaction below: resumed, it answers with the kept body.
          let waiters: Array<Waiter> | undefined
          for (const reader of stream.readers.keys()) {
            if (!(reader instanceof Waiter)) endReader(reader)
            else if (waiters === undefined) waiters = [reader]
            else waiters.push(reader)
          }
          stream.readers.clear()
          // Last, and contained: a keeper that throws leaves a finished stream with its events
          // (followed as any other), never one left half finished (D352).
          yield* Effect.sync(() => compactAndCount(stream)).pipe(
            Effect.catchDefect((defect) => Effect.logError("A finished stream's reply was not kept", defect))
          )
          if (waiters !== undefined) for (const waiter of waiters) waiter.end()
        })
      })

    const start = <E>(
      id: string,
      work: (publish: (event: E) => void, end: Effect.Effect<void>) => Effect.Effect<void>
    ) =>
      Effect.gen(function* () {
        const token = randomText(24, "base64url")
        const stream: LiveStream<E> = {
          id,
          tokenHash: hashToken(token),
          events: [],
          readers: new Map(),
          fiber: undefined,
          finishedAt: undefined,
          done: false,
          whenDone: undefined,
          stopRequested: false,
          keeper: undefined,
          kept: undefined
        }
        streams.set(id, stream as LiveStream<unknown>)
        const publish = (event: E) => {
          // After the end nothing more is published (the readers were told the end).
          if (stream.finishedAt !== undefined) return
          // Past the buffer's bound the event still reaches every live reader (what is metered
          // is delivered); only a later reconnect would miss it.
          const indexed = { index: stream.events.length, event }
          if (stream.events.length < MAX_EVENTS) stream.events.push(event)
          for (const [reader, map] of stream.readers) {
            const item = map(indexed)
            if (item !== undefined && !(reader instanceof Waiter)) offer(reader, item)
          }
        }
        const fiber = yield* work(publish, finish(stream)).pipe(
          Effect.ensuring(
            Effect.suspend(() => {
              // Kept for replay are the events and this record only: the finished fiber holds the
              // context it was started in (the caller's HTTP request among it) and `work`'s closure.
              stream.done = true
              stream.fiber = undefined
              const whenDone = stream.whenDone
              stream.whenDone = undefined
              if (whenDone !== undefined) for (const told of whenDone) told()
              // An oldest stream whose work was still ending held the budget's trim back.
              finished.trim(isDone, drop)
              return finish(stream)
            })
          ),
          // Started at once and uninterruptible until `work` opens its own interruptible
          // region: a stop that arrives first must still let `work` settle what it holds.
          Effect.forkIn(scope, { startImmediately: true, uninterruptible: true }),
          // Forked under the shared services (a fork takes the current context): the request's own
          // would otherwise be held by the work for the life of the reply (D460).
          detached
        )
        if (!stream.done) stream.fiber = fiber
        return { stream, token }
      })

    const stop = <E>(stream: LiveStream<E>) =>
      Effect.gen(function* () {
        stream.stopRequested = true
        if (stream.fiber !== undefined) yield* Fiber.interrupt(stream.fiber)
      })

    // The reader joins, and its leaving is added to the reader's scope, in one uninterruptible step;
    // its pulls take what it was handed. `Stream.callback` would run the registration in a fiber of
    // its own, one per reply written (D473), and give it a queue (D463).
    const follow = <E, A>(stream: LiveStream<E>, from: number, reader?: ReaderOptions<E, A>) =>
      Stream.fromChannel(
        Channel.fromTransform((_, readerScope) =>
          Effect.uninterruptible(
            Effect.suspend(() => {
              const joined = join(stream, from, reader)
              return Effect.as(Scope.addFinalizer(readerScope, leave(stream, joined)), pullOf(joined))
            })
          )
        )
      )

    /** What the reader reads so far is handed to it, and it is registered for the rest. */
    const join = <E, A>(stream: LiveStream<E>, from: number, reader: ReaderOptions<E, A> | undefined) => {
      const joined: Buffered = { pending: [], ended: false, failure: undefined, wake: undefined }
      // Checked in the same step that reads the events: nothing can compact in between.
      if (stream.kept !== undefined) {
        if (reader?.compacted === undefined) joined.failure = new Compacted()
        else {
          joined.pending.push(...reader.compacted(stream.kept))
          joined.ended = true
        }
        return joined
      }
      const map: ReaderMap<E> = reader?.map ?? asIndexed
      if (reader?.opening !== undefined) joined.pending.push(...reader.opening)
      for (let i = Math.max(0, from); i < stream.events.length; i++) {
        const item = map({ index: i, event: stream.events[i]! })
        if (item !== undefined) joined.pending.push(item)
      }
      if (stream.finishedAt !== undefined) joined.ended = true
      else stream.readers.set(joined, map)
      return joined
    }

    /** A reader leaves; the last one to leave mid-work stops it unless someone reconnects in time. */
    const leave = <E>(stream: LiveStream<E>, reader: Reader) =>
      Effect.suspend(() => {
        stream.readers.delete(reader)
        if (stream.readers.size > 0 || stream.finishedAt !== undefined) return Effect.void
        return Effect.sleep(GRACE).pipe(
          Effect.andThen(
            Effect.suspend(() =>
              stream.readers.size === 0 && stream.finishedAt === undefined ? stop(stream) : Effect.void
            )
          ),
          Effect.forkIn(scope),
          Effect.asVoid
        )
      })

    const awaitEnd = <E>(stream: LiveStream<E>) =>
      Effect.callback<void>((resume) => {
        if (stream.finishedAt !== undefined) return resume(Effect.void)
        const waiter = new Waiter(() => resume(Effect.void))
        stream.readers.set(waiter, takesNothing)
        // Interrupted while waiting (the caller hung up): it leaves as any reader does.
        return leave(stream, waiter)
      })

    yield* Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      finished.trim(isDone, drop, now - RETENTION_MS)
      for (const [id, stream] of streams) {
        if (stream.done && stream.finishedAt !== undefined && now - stream.finishedAt > RETENTION_MS) {
          streams.delete(id)
        }
      }
    }).pipe(Effect.repeat(Schedule.spaced("30 seconds")), Effect.forkScoped)

    const unfinished = () => [...streams.values()].filter((stream) => !stream.done)

    const awaitDone = (id: string, millis: number) =>
      Effect.suspend(() => {
        const stream = streams.get(id)
        // Still serving: there is nothing settled to wait for yet.
        if (stream === undefined || stream.done || stream.finishedAt === undefined) return Effect.void
        return within(
          Effect.callback<void>((resume) => {
            // It may have ended since the look above.
            if (stream.done) return resume(Effect.void)
            const told = () => resume(Effect.void)
            stream.whenDone ??= []
            stream.whenDone.push(told)
            return Effect.sync(() => {
              const index = stream.whenDone?.indexOf(told) ?? -1
              if (index >= 0) stream.whenDone!.splice(index, 1)
            })
          }),
          millis
        ).pipe(Effect.catch(() => Effect.void))
      })

    return LiveStreams.of({
      start,
      get: <E>(id: string) => streams.get(id) as LiveStream<E> | undefined,
      follow: follow as LiveStreams["Service"]["follow"],
      awaitEnd,
      awaitDone,
      keep: (stream, keeper) => {
        stream.keeper = keeper
        compactAndCount(stream)
      },
      stop,
      running: Effect.sync(() => unfinished().length),
      stopAll: Effect.suspend(() =>
        Effect.forEach(unfinished(), stop, { concurrency: "unbounded", discard: true })
      ),
      verify: (stream, token) => token !== undefined && hashToken(token) === stream.tokenHash
    })
  })
