import type { Candle, ClassStats } from "../domain/MarketData.ts"
import {
  addProviderClear,
  type ByKeyAndTime,
  emptyProviderFigures,
  keyedEntry,
  type ProviderFigures,
  subtractProviderFigures
} from "./MinuteFigures.ts"
import {
  type Aggregate,
  addClear,
  byTime,
  type ClearRecord,
  candleOf,
  compositeIndexOf,
  emptyAggregate,
  type Grid,
  type IndexResult,
  MINUTE_MS,
  mergeAggregate,
  statsOf,
  tokensOf
} from "./Series.ts"
import { TtftHours } from "./TtftHours.ts"

const HOUR_MS = 60 * MINUTE_MS

/** The start of the minute holding `at`. */
const minuteOf = (at: number) => at - (((at % MINUTE_MS) + MINUTE_MS) % MINUTE_MS)
const SECOND_MS = 1_000
const secondOf = (at: number) => at - (((at % SECOND_MS) + SECOND_MS) % SECOND_MS)

/** The clears on the tape: the snapshot shows 25 (`TAPE_LENGTH`). */
export const TAPE_KEEP = 100

/** First index whose clear is not before `at` (clears sorted `byTime`). */
export const lowerBound = (clears: ReadonlyArray<ClearRecord>, at: number) => {
  let lo = 0
  let hi = clears.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (clears[mid]!.at < at) lo = mid + 1
    else hi = mid
  }
  return lo
}

/** Ids remembered to know a clear seen before (a catch-up re-reads the last 1,000; D549): the newest this many. */
export const SEEN_IDS = 100_000

/** A provider's clears over the stats window. */
export interface ProviderDay {
  readonly clears: number
  readonly volume: number
  readonly tokens: number
  /** The classes it cleared in. */
  readonly classes: ReadonlyArray<string>
  readonly ttftQuantile: (q: number) => number | null
}

/**
 * The clears of a rolling window, kept so that no read costs a pass over them (D124, D231) and so that what
 * is kept does not grow with the number of clears (D549): one aggregate per class and minute over the series
 * windows (candles, the index and stats in whole minutes read these); for the stats window (the whole minutes
 * since `now - statsMs`) each class's TTFTs and each provider's figures, counted per minute and summed; the
 * aggregates per second only for `rawMs` (sub-minute candles and index of a window of at most an hour), and the
 * newest clears for the tape. A clear is added once (by id), in any order; `roll` moves the windows forward. `version` changes
 * whenever what a read could answer changes (a clear added, a window moved), so answers can be cached by it.
 */
export class ClearWindow {
  /** The newest `TAPE_KEEP` clears, by time: the tape. */
  private tape: Array<ClearRecord> = []
  /** Each class's aggregate per whole second of the raw window: sub-minute candles and the index (D551). */
  private readonly seconds = new Map<string, Map<number, Aggregate>>()
  /** The newest `SEEN_IDS` ids added, and the same in the order added (a ring: the oldest is overwritten). */
  private readonly ids = new Set<number>()
  private readonly idRing = new Float64Array(SEEN_IDS)
  private idCount = 0
  private readonly minutes = new Map<string, Map<number, Aggregate>>()
  /** Each class's hours merged from its minutes, computed when read and forgotten when one changes. */
  private readonly hours = new Map<string, Map<number, Aggregate>>()
  /** Each class's and each provider's TTFTs over the hours that overlap the stats window. */
  private readonly classTtfts = new TtftHours()
  private readonly providerTtfts = new TtftHours()
  /** Each provider's figures in the stats window, by minute and summed. */
  private readonly providerMinutes: ByKeyAndTime<ProviderFigures> = new Map()
  private readonly providers = new Map<string, ProviderFigures>()
  /** Clears at or after this are in the stats (a whole minute). */
  private statsFrom = Number.NEGATIVE_INFINITY
  /** Minutes at or after this are kept (a whole minute). */
  private keepFrom = Number.NEGATIVE_INFINITY
  /** Raw clears at or after this are kept (a whole minute). */
  private rawFrom = Number.NEGATIVE_INFINITY
  maxId = 0
  version = 0

  /** The stats window (24 h). */
  private readonly statsMs: number
  /** How long the minutes are kept (at least the longest series window plus a bucket). */
  private readonly keepMs: number
  /** How long the per-second aggregates are kept (at least the longest window of sub-minute buckets and a bucket). */
  private readonly rawMs: number

  constructor(statsMs: number, keepMs: number, rawMs = keepMs) {
    this.statsMs = statsMs
    this.keepMs = keepMs
    this.rawMs = Math.min(rawMs, keepMs)
  }

  /** How many ids are remembered to count each clear once (at most `SEEN_IDS`). */
  get rememberedIds() {
    return this.ids.size
  }

  /** How many per-second aggregates are held (at most the raw window's seconds for each class). */
  get heldSeconds() {
    let n = 0
    for (const bySecond of this.seconds.values()) n += bySecond.size
    return n
  }

  /** Adds a clear unless it is known or older than what is kept; says whether anything changed. */
  add(c: ClearRecord): boolean {
    if (this.ids.has(c.id) || c.at < this.keepFrom) return false
    // Not the Set's own first entry: a Set emptied from its front keeps its holes until it grows again, and
    // each look for the first entry would walk them.
    const slot = this.idCount % SEEN_IDS
    if (this.idCount >= SEEN_IDS) this.ids.delete(this.idRing[slot]!)
    this.idRing[slot] = c.id
    this.idCount += 1
    this.ids.add(c.id)
    if (c.id > this.maxId) this.maxId = c.id
    if (c.at >= this.rawFrom)
      addClear(keyedEntry(this.seconds, c.modelClass, secondOf(c.at), emptyAggregate), c)
    this.onTape(c)
    this.count(c)
    this.version += 1
    return true
  }

  /** Keeps `c` on the tape when it is among the newest `TAPE_KEEP`, in time order. */
  private onTape(c: ClearRecord) {
    const tape = this.tape
    if (tape.length >= TAPE_KEEP && byTime(c, tape[0]!) < 0) return
    let i = tape.length
    while (i > 0 && byTime(tape[i - 1]!, c) > 0) i -= 1
    tape.splice(i, 0, c)
    if (tape.length > TAPE_KEEP) tape.shift()
  }

  private count(c: ClearRecord) {
    const minute = minuteOf(c.at)
    addClear(keyedEntry(this.minutes, c.modelClass, minute, emptyAggregate), c)
    this.hours.get(c.modelClass)?.delete(minute - (((minute % HOUR_MS) + HOUR_MS) % HOUR_MS))
    if (c.at < this.statsFrom) return
    this.classTtfts.add(c.modelClass, c.at, c.ttftMs)
    this.providerTtfts.add(c.provider, c.at, c.ttftMs)
    const one = { modelClass: c.modelClass, charged: c.charged, tokens: tokensOf(c) }
    addProviderClear(keyedEntry(this.providerMinutes, c.provider, minute, emptyProviderFigures), one)
    let day = this.providers.get(c.provider)
    if (day === undefined) {
      day = emptyProviderFigures()
      this.providers.set(c.provider, day)
    }
    addProviderClear(day, one)
  }

  /** Moves the windows to `now`: what falls out of the stats leaves them, what falls out of keeping goes. */
  roll(now: number) {
    const statsFrom = Math.floor((now - this.statsMs) / MINUTE_MS) * MINUTE_MS
    if (statsFrom > this.statsFrom) {
      this.classTtfts.roll(statsFrom)
      this.providerTtfts.roll(statsFrom)
      for (const [provider, byMinute] of this.providerMinutes) {
        const day = this.providers.get(provider)!
        for (const [minute, figures] of byMinute) {
          if (minute >= statsFrom) continue
          subtractProviderFigures(day, figures)
          byMinute.delete(minute)
        }
        if (day.count === 0) {
          this.providers.delete(provider)
          this.providerMinutes.delete(provider)
        }
      }
      this.statsFrom = statsFrom
      this.version += 1
    }
    const keepFrom = minuteOf(Math.min(statsFrom, now - this.keepMs))
    const rawFrom = Math.max(keepFrom, minuteOf(now - this.rawMs))
    if (rawFrom > this.rawFrom) {
      for (const bySecond of this.seconds.values()) {
        for (const second of bySecond.keys()) if (second < rawFrom) bySecond.delete(second)
      }
      this.rawFrom = rawFrom
      this.version += 1
    }
    if (keepFrom > this.keepFrom) {
      for (const byMinute of this.minutes.values()) {
        for (const minute of byMinute.keys()) if (minute < keepFrom) byMinute.delete(minute)
      }
      for (const byHour of this.hours.values()) {
        for (const hour of byHour.keys()) if (hour < keepFrom) byHour.delete(hour)
      }
      const cut = lowerBound(this.tape, keepFrom)
      if (cut > 0) this.tape = this.tape.slice(cut)
      this.keepFrom = keepFrom
      this.version += 1
    }
  }

  /** A provider's clears over the stats window; undefined when it cleared none there. */
  provider(id: string): ProviderDay | undefined {
    const day = this.providers.get(id)
    if (day === undefined || day.count === 0) return undefined
    return {
      clears: day.count,
      volume: day.volume,
      tokens: day.tokens,
      classes: [...day.classes.keys()],
      ttftQuantile: (q) => this.providerTtfts.quantile(id, q)
    }
  }

  /** The newest `n` clears (at most `TAPE_KEEP`), newest first. */
  latest(n: number): ReadonlyArray<ClearRecord> {
    return this.tape.slice(-n).reverse()
  }

  /** A class's hour (a multiple of an hour) merged from its minutes; kept until one of them changes. */
  private hour(modelClass: string, byMinute: Map<number, Aggregate>, hour: number): Aggregate {
    let byHour = this.hours.get(modelClass)
    if (byHour === undefined) {
      byHour = new Map()
      this.hours.set(modelClass, byHour)
    }
    let agg = byHour.get(hour)
    if (agg === undefined) {
      agg = emptyAggregate()
      for (let minute = hour; minute < hour + HOUR_MS; minute += MINUTE_MS) {
        const m = byMinute.get(minute)
        if (m !== undefined) mergeAggregate(agg, m)
      }
      byHour.set(hour, agg)
    }
    return agg
  }

  /**
   * Merges into `into` a class's clears in `[from, to)` (whole minutes): whole hours from the hours,
   * the rest minute by minute, so a day costs about 24 + 120 look-ups, whatever the number of clears.
   */
  private mergeSpan(into: Aggregate, modelClass: string, from: number, to: number) {
    const byMinute = this.minutes.get(modelClass)
    if (byMinute === undefined || byMinute.size === 0) return
    let t = from
    while (t < to) {
      if (t % HOUR_MS === 0 && t + HOUR_MS <= to) {
        mergeAggregate(into, this.hour(modelClass, byMinute, t))
        t += HOUR_MS
      } else {
        const m = byMinute.get(t)
        if (m !== undefined) mergeAggregate(into, m)
        t += MINUTE_MS
      }
    }
  }

  /** Each class's summary over the stats window. */
  stats(classes: ReadonlyArray<string>): Array<ClassStats> {
    return classes.map((modelClass) => {
      const agg = emptyAggregate()
      const byMinute = this.minutes.get(modelClass)
      if (byMinute !== undefined && byMinute.size > 0) {
        let last = this.statsFrom
        for (const minute of byMinute.keys()) if (minute > last) last = minute
        this.mergeSpan(agg, modelClass, this.statsFrom, last + MINUTE_MS)
      }
      return statsOf(modelClass, agg, (q) => this.classTtfts.quantile(modelClass, q))
    })
  }

  /**
   * One aggregate per bucket of a grid, from the per-minute aggregates of the classes given when its buckets are
   * whole minutes (a look-up per minute of the grid), else from the per-second ones of the raw window (a grid of
   * sub-minute buckets spans at most an hour, D231, and its buckets are whole seconds, D551): whatever the number
   * of clears.
   */
  buckets(classes: ReadonlyArray<string>, grid: Grid): Array<Aggregate> {
    const minutes = grid.bucketMs % MINUTE_MS === 0 && grid.from % MINUTE_MS === 0
    if (!minutes && (grid.bucketMs % SECOND_MS !== 0 || grid.from % SECOND_MS !== 0)) {
      throw new RangeError(`a grid of ${grid.bucketMs} ms buckets from ${grid.from} is not in whole seconds`)
    }
    return Array.from({ length: grid.points }, (_, i) => {
      const agg = emptyAggregate()
      const from = grid.from + i * grid.bucketMs
      for (const modelClass of classes) {
        if (minutes) this.mergeSpan(agg, modelClass, from, from + grid.bucketMs)
        else {
          const bySecond = this.seconds.get(modelClass)
          if (bySecond === undefined || bySecond.size === 0) continue
          for (let t = from; t < from + grid.bucketMs; t += SECOND_MS) {
            const s = bySecond.get(t)
            if (s !== undefined) mergeAggregate(agg, s)
          }
        }
      }
      return agg
    })
  }

  /** Candles of the classes given (their sum: the whole market when given every class). */
  candles(classes: ReadonlyArray<string>, grid: Grid): Array<Candle> {
    return this.buckets(classes, grid).map((agg, i) => candleOf(grid.from + i * grid.bucketMs, agg))
  }

  /** The composite index of the classes given over a grid. */
  index(classes: ReadonlyArray<string>, grid: Grid): IndexResult {
    return compositeIndexOf(
      classes.map((modelClass) => ({ modelClass, buckets: this.buckets([modelClass], grid) })),
      grid
    )
  }

  /** Every class that has a clear kept. */
  classes(): ReadonlyArray<string> {
    return [...this.minutes.keys()]
  }
}

/** A cached answer and its JSON body, encoded once when first asked for. */
export interface CachedAnswer<A> {
  readonly value: A
  readonly body: () => Uint8Array
}

/**
 * Answers computed from a window, each kept with the window's `version` it was computed at and served
 * while that version stands (with its body encoded at most once); at most `size` kept, oldest out first.
 */
export class SeriesCache {
  private readonly entries = new Map<string, { readonly version: number; readonly answer: unknown }>()

  private readonly size: number

  constructor(size: number) {
    this.size = size
  }

  get<A>(key: string, version: number, compute: () => A, encode: (value: A) => Uint8Array): CachedAnswer<A> {
    const hit = this.entries.get(key)
    if (hit !== undefined && hit.version === version) return hit.answer as CachedAnswer<A>
    const value = compute()
    let body: Uint8Array | undefined
    const answer: CachedAnswer<A> = {
      value,
      body: () => {
        body ??= encode(value)
        return body
      }
    }
    this.entries.delete(key)
    this.entries.set(key, { version, answer })
    if (this.entries.size > this.size) this.entries.delete(this.entries.keys().next().value!)
    return answer
  }
}
