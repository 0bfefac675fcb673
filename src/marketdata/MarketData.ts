import type { Readable } from "node:stream"
import { PgClient } from "@effect/sql-pg"
import { Clock, Config, Context, Effect, Layer, Queue, Schedule, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { InvalidRequest } from "../domain/Errors.ts"
import type { ModelList } from "../domain/Market.ts"
import { Candles, MarketIndex, type MarketSnapshot, type MarketStats } from "../domain/MarketData.ts"
import { Listings } from "../market/Listings.ts"
import { ModelCatalog } from "../market/ModelCatalog.ts"
import { Drain } from "../process/Drain.ts"
import { type Fanout, makeFanout } from "./Fanout.ts"
import {
  type ClearRecord,
  type Grid,
  MINUTE_MS,
  PRICE_UNIT,
  resolveGrid,
  SERIES_BOUNDS,
  tapeEntry
} from "./Series.ts"
import { ClearWindow, SeriesCache } from "./Window.ts"

/** The rolling window of spec 8 (24 h): what stats cover and what is kept in memory for the series. */
export const STATS_WINDOW_MS = 86_400_000
/** Clears on the snapshot's tape, newest first. */
export const TAPE_LENGTH = 25
/** The snapshot's index: the whole market over the stats window in hourly buckets. */
const SNAPSHOT_INDEX_BUCKET_MS = 3_600_000

export interface MarketDataSettings {
  /** Subscribers `GET /v1/market/events` holds at once; one more is answered 503. */
  readonly eventsCapacity: number
  /** Frames a subscriber may fall behind by before it is dropped. */
  readonly subscriberQueue: number
  readonly heartbeatMs: number
  /** How often the book is looked at for quotes in or out. */
  readonly bookPollMs: number
  /** The least time between two published frames (a burst of clears is one frame). */
  readonly minFrameGapMs: number
}

export class MarketDataConfig extends Context.Service<MarketDataConfig, MarketDataSettings>()(
  "router/marketdata/MarketDataConfig"
) {
  static readonly layer = Layer.effect(
    MarketDataConfig,
    Effect.gen(function* () {
      const eventsCapacity = yield* Config.Int("MARKET_EVENTS_CAPACITY").pipe(Config.withDefault(1000))
      const heartbeatSeconds = yield* Config.Int("MARKET_EVENTS_HEARTBEAT_SECONDS").pipe(
        Config.withDefault(15)
      )
      return MarketDataConfig.of({
        eventsCapacity,
        subscriberQueue: 16,
        heartbeatMs: heartbeatSeconds * 1000,
        bookPollMs: 1000,
        minFrameGapMs: 20
      })
    })
  )

  static readonly layerTest = (overrides: Partial<MarketDataSettings> = {}) =>
    Layer.succeed(
      MarketDataConfig,
      MarketDataConfig.of({
        eventsCapacity: 1000,
        subscriberQueue: 16,
        heartbeatMs: 15_000,
        bookPollMs: 200,
        minFrameGapMs: 20,
        ...overrides
      })
    )
}

export interface SeriesQuery {
  readonly window_ms?: number | undefined
  readonly bucket_ms?: number | undefined
}

/** A `market_clears` row (BIGINT columns arrive as strings from the driver, as numbers in a notification). */
export const clearOfRow = (row: Record<string, unknown>): ClearRecord => ({
  id: Number(row.id),
  requestId: String(row.request_id),
  at: Number(row.at_ms),
  modelClass: String(row.model_class),
  provider: String(row.provider_id),
  profile: String(row.profile),
  priceIn: Number(row.price_in),
  priceOut: Number(row.price_out),
  tokensIn: Number(row.tokens_in),
  tokensOut: Number(row.tokens_out),
  tokensCached: Number(row.tokens_cached),
  chargeNum: Number(row.charge_num),
  charged: Number(row.charged),
  ttftMs: Number(row.ttft_ms),
  priceSetter: String(row.price_setter),
  quotesCompeting: Number(row.quotes_competing)
})

const CLEAR_COLUMNS = `id, request_id, at_ms, model_class, provider_id, profile, price_in, price_out, tokens_in,
  tokens_out, tokens_cached, charge_num, charged, ttft_ms, price_setter, quotes_competing`

const encoder = new TextEncoder()

/** A series answer as its endpoint's schema encodes it, in JSON bytes. */
const jsonOf =
  <A>(schema: Schema.Codec<A, unknown>) =>
  (value: A): Uint8Array =>
    encoder.encode(JSON.stringify(Schema.encodeSync(schema)(value)))
const encodeCandles = jsonOf(Candles)
const encodeIndex = jsonOf(MarketIndex)

/**
 * Public market data (spec 4.4, docs/decisions.md D120–D126). The clears of the last 24 h are counted in
 * memory (`Window.ts`, D549, D551): loaded from `market_clears` at start, then fed by the trigger's notification
 * of each committed clear (with a catch-up read every 10 s in case one was missed). The snapshot is
 * computed once per change (a clear, a quote in or out) and encoded once; every subscriber of the
 * events gets those same bytes, written to all of them in one pass (`Fanout.ts`). Reads of candles, the index and stats run over the window
 * in memory, never a query per request.
 */
export class MarketData extends Context.Service<
  MarketData,
  {
    readonly snapshot: Effect.Effect<MarketSnapshot>
    readonly candles: (
      query: SeriesQuery & { readonly model_class?: string | undefined }
    ) => Effect.Effect<Candles, InvalidRequest>
    readonly index: (
      query: SeriesQuery & { readonly classes?: string | undefined }
    ) => Effect.Effect<MarketIndex, InvalidRequest>
    /** The candles' JSON body, encoded once per grid and state of the window (D231). */
    readonly candlesBody: (
      query: SeriesQuery & { readonly model_class?: string | undefined }
    ) => Effect.Effect<Uint8Array, InvalidRequest>
    /** The index's JSON body, encoded once per grid, basket and state of the window (D231). */
    readonly indexBody: (
      query: SeriesQuery & { readonly classes?: string | undefined }
    ) => Effect.Effect<Uint8Array, InvalidRequest>
    readonly stats: Effect.Effect<MarketStats>
    /** The events stream of one new subscriber (the current snapshot first), or undefined when full. */
    readonly subscribe: Effect.Effect<Readable | undefined>
    /** The clears of the rolling window (for the analytics of the same records). */
    readonly window: Effect.Effect<ClearWindow>
    readonly fanout: Fanout
  }
>()("router/marketdata/MarketData") {
  static readonly layer = Layer.effect(
    MarketData,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const pg = yield* PgClient.PgClient
      const listings = yield* Listings
      const catalog = yield* ModelCatalog
      const settings = yield* MarketDataConfig
      const drain = yield* Drain
      const classIds = catalog.classes.map((c) => c.id)

      // Minutes for the longest series window and a bucket; seconds for the longest window of sub-minute
      // buckets (an hour) and a minute (D549, D551).
      const held = new ClearWindow(
        STATS_WINDOW_MS,
        STATS_WINDOW_MS + SERIES_BOUNDS.maxWindowMs / 24,
        SERIES_BOUNDS.minuteBucketsAboveMs + MINUTE_MS
      )

      const load = (rows: ReadonlyArray<Record<string, unknown>>) => {
        let added = false
        for (const row of rows) added = held.add(clearOfRow(row)) || added
        return added
      }

      const started = yield* Clock.currentTimeMillis
      held.roll(started)
      load(
        yield* sql
          .unsafe<Record<string, unknown>>(
            // In id order: the window counts a clear once by the newest ids it saw (D549), and a catch-up
            // re-reads the newest ids.
            `SELECT ${CLEAR_COLUMNS} FROM market_clears WHERE at_ms >= $1 ORDER BY id`,
            [started - STATS_WINDOW_MS - 60_000]
          )
          .pipe(Effect.orDie)
      )

      // The book and the model list as of the last look, with what makes them differ.
      let models: ModelList["data"] = []
      let book: MarketSnapshot["book"] = []
      let bookPrint = ""
      const lookAtBook = Effect.gen(function* () {
        const [list, ladder] = yield* Effect.all([listings.models, listings.book])
        const print = JSON.stringify([ladder.classes, list.data.map((m) => [m.id, m.live_depth, m.best_ask])])
        models = list.data
        book = ladder.classes
        if (print === bookPrint) return false
        bookPrint = print
        return true
      })
      yield* lookAtBook

      let sequence = yield* Clock.currentTimeMillis
      const economicsAt = (now: number) => {
        held.roll(now)
        const to = (Math.floor(now / SNAPSHOT_INDEX_BUCKET_MS) + 1) * SNAPSHOT_INDEX_BUCKET_MS
        const grid: Grid = {
          windowMs: STATS_WINDOW_MS,
          bucketMs: SNAPSHOT_INDEX_BUCKET_MS,
          from: to - STATS_WINDOW_MS,
          to,
          points: STATS_WINDOW_MS / SNAPSHOT_INDEX_BUCKET_MS
        }
        const index = held.index(classIds, grid)
        return {
          last_clears: held.latest(TAPE_LENGTH).map(tapeEntry),
          index: { value: index.value, components: index.components },
          stats: held.stats(classIds)
        }
      }

      const compute = Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        sequence += 1
        const snapshot: MarketSnapshot = {
          object: "market.snapshot",
          as_of: now,
          sequence,
          unit: PRICE_UNIT,
          models,
          book,
          economics: economicsAt(now)
        }
        return snapshot
      })

      const frameOf = (snapshot: MarketSnapshot) =>
        encoder.encode(`id: ${snapshot.sequence}\ndata: ${JSON.stringify(snapshot)}\n\n`)

      let current = yield* compute
      let currentFrame = frameOf(current)
      // Whether something changed since `current` was computed while nobody was subscribed: every paid
      // request's clear is a change, and computing the economics for no reader cost CPU on each (D323).
      let stale = false
      const refresh = Effect.map(compute, (snapshot) => {
        current = snapshot
        currentFrame = frameOf(snapshot)
        stale = false
      })
      const fresh = Effect.suspend(() => (stale ? refresh : Effect.void))
      const fanout = makeFanout({ capacity: settings.eventsCapacity, queue: settings.subscriberQueue })

      // One computation per change, fanned out: the publisher waits for a change, computes and encodes
      // the snapshot once, offers the same bytes to every subscriber, then lets a burst gather. With no
      // subscriber it only marks the snapshot stale; the next read computes it.
      const wake = yield* Queue.sliding<void>(1)
      const changed = () => {
        Queue.offerUnsafe(wake, undefined)
      }
      const publish = Effect.gen(function* () {
        yield* Queue.take(wake)
        if (fanout.size() === 0) {
          stale = true
          return
        }
        yield* refresh
        fanout.publish(currentFrame)
        yield* Effect.sleep(settings.minFrameGapMs)
      })
      yield* Effect.forever(publish).pipe(Effect.forkScoped)
      // A shutdown ends the events streams when it starts draining: they hold connections open but
      // are not paid work, and the HTTP server's close would otherwise wait for them (up to 20 s) and
      // then cut them mid-frame. A subscriber reconnects to another instance (new ones here get 503).
      yield* drain.whenDraining.pipe(Effect.andThen(Effect.sync(fanout.close)), Effect.forkScoped)

      const catchUp = Effect.gen(function* () {
        const rows = yield* sql.unsafe<Record<string, unknown>>(
          `SELECT ${CLEAR_COLUMNS} FROM market_clears WHERE id > $1 AND at_ms >= $2 ORDER BY id`,
          [Math.max(0, held.maxId - 1000), (yield* Clock.currentTimeMillis) - STATS_WINDOW_MS]
        )
        if (load(rows)) changed()
      })

      const listen = Effect.scoped(
        Effect.gen(function* () {
          const notes = yield* pg.listen("market_clears")
          yield* catchUp
          yield* Effect.forever(
            Effect.gen(function* () {
              const note = yield* Queue.take(notes)
              if (held.add(clearOfRow(JSON.parse(note.payload) as Record<string, unknown>))) changed()
            })
          )
        })
      )
      yield* listen.pipe(
        Effect.catchCause((cause) => Effect.logWarning("market data: clear notifications lost", cause)),
        Effect.repeat(Schedule.spaced("1 second")),
        Effect.forkScoped
      )
      yield* catchUp.pipe(
        Effect.catchCause((cause) => Effect.logWarning("market data: catch-up failed", cause)),
        Effect.repeat(Schedule.spaced("10 seconds")),
        Effect.forkScoped
      )
      yield* Effect.gen(function* () {
        if (yield* lookAtBook) changed()
      }).pipe(
        Effect.catchCause((cause) => Effect.logWarning("market data: book look failed", cause)),
        Effect.repeat(Schedule.spaced(settings.bookPollMs)),
        Effect.forkScoped
      )
      // The window rolls once a minute whether or not anything reads it: what it keeps is bounded by its
      // rolls (an instance that only serves paid calls still counts every clear, D549), and the snapshot is
      // recomputed even when nothing cleared.
      yield* Effect.gen(function* () {
        held.roll(yield* Clock.currentTimeMillis)
        changed()
      }).pipe(Effect.repeat(Schedule.spaced("1 minute")), Effect.forkScoped)
      const heartbeat = encoder.encode(": heartbeat\n\n")
      yield* Effect.sync(() => fanout.publish(heartbeat)).pipe(
        Effect.repeat(Schedule.spaced(settings.heartbeatMs)),
        Effect.forkScoped
      )

      const refuse = (error: { param: string; message: string }) =>
        new InvalidRequest({ code: "invalid_range", param: error.param, message: error.message })

      const gridFor = (query: SeriesQuery) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const resolved = resolveGrid(now, SERIES_BOUNDS, query.window_ms, query.bucket_ms)
          if (resolved._tag === "Refused") return Effect.fail(refuse(resolved.error))
          held.roll(now)
          return Effect.succeed(resolved.grid)
        })

      const seriesFields = (grid: Grid) => ({
        unit: PRICE_UNIT,
        window_ms: grid.windowMs,
        bucket_ms: grid.bucketMs,
        from: grid.from,
        to: grid.to
      })

      const knownClass = (id: string) =>
        catalog.find(id) === undefined
          ? Effect.fail(
              new InvalidRequest({
                code: "unknown_model_class",
                param: "model_class",
                message: `Unknown model class ${id}`
              })
            )
          : Effect.succeed(id)

      // A series answer is a function of its grid, its classes and what the window holds: kept until
      // the window changes (a clear, a roll), so a burst of readers of one chart computes it once.
      const answers = new SeriesCache(64)

      const candlesOf = Effect.fn("MarketData.candles")(function* (
        query: SeriesQuery & { readonly model_class?: string | undefined }
      ) {
        const grid = yield* gridFor(query)
        const modelClass = query.model_class === undefined ? null : yield* knownClass(query.model_class)
        const key = `candles|${modelClass}|${grid.from}|${grid.to}|${grid.bucketMs}`
        return answers.get(
          key,
          held.version,
          (): Candles => {
            const classes = modelClass === null ? held.classes() : [modelClass]
            return {
              object: "market.candles",
              model_class: modelClass,
              ...seriesFields(grid),
              candles: held.candles(classes, grid)
            }
          },
          encodeCandles
        )
      })

      const indexOf = Effect.fn("MarketData.index")(function* (
        query: SeriesQuery & { readonly classes?: string | undefined }
      ) {
        const grid = yield* gridFor(query)
        const basket =
          query.classes === undefined || query.classes.trim() === ""
            ? classIds
            : [...new Set(query.classes.split(",").map((s) => s.trim()))]
        for (const id of basket) yield* knownClass(id)
        const key = `index|${basket.join(",")}|${grid.from}|${grid.to}|${grid.bucketMs}`
        return answers.get(
          key,
          held.version,
          (): MarketIndex => {
            const result = held.index(basket, grid)
            return {
              object: "market.index",
              classes: basket,
              ...seriesFields(grid),
              value: result.value,
              components: result.components,
              series: result.series
            }
          },
          encodeIndex
        )
      })

      const stats = Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        held.roll(now)
        return {
          object: "market.stats" as const,
          unit: PRICE_UNIT,
          window_ms: STATS_WINDOW_MS,
          as_of: now,
          classes: held.stats(classIds)
        }
      }).pipe(Effect.withSpan("MarketData.stats"))

      return MarketData.of({
        snapshot: Effect.map(fresh, () => current),
        candles: (query) => Effect.map(candlesOf(query), (answer) => answer.value),
        candlesBody: (query) => Effect.map(candlesOf(query), (answer) => answer.body()),
        index: (query) => Effect.map(indexOf(query), (answer) => answer.value),
        indexBody: (query) => Effect.map(indexOf(query), (answer) => answer.body()),
        stats,
        subscribe: Effect.flatMap(fresh, () => fanout.open(currentFrame)),
        window: Effect.sync(() => held),
        fanout
      })
    })
  )
}
