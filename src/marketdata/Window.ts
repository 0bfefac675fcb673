import type { ClassStats } from "../domain/MarketData.ts"
import {
  type Aggregate,
  addClear,
  byTime,
  type ClearRecord,
  compositeIndexOf,
  emptyAggregate,
  type Grid,
  type IndexResult,
  mergeAggregate,
  statsOf
} from "./Series.ts"

const MINUTE_MS = 60_000

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

/** Index of the first value not below `value` in a sorted array. */
const sortedIndex = (values: ReadonlyArray<number>, value: number) => {
  let lo = 0
  let hi = values.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (values[mid]! < value) lo = mid + 1
    else hi = mid
  }
  return lo
}

/**
 * The clears of a rolling window, kept so that the snapshot costs no pass over them (D124): raw clears
 * sorted by time (for candles at any bucket), and for the stats window (the whole minutes since
 * `now - statsMs`) one aggregate per class and minute and each class's TTFTs, sorted. A clear is added
 * once (by id), in any order; `roll` moves the windows forward.
 */
export class ClearWindow {
  private clears: Array<ClearRecord> = []
  private readonly ids = new Set<number>()
  private readonly minutes = new Map<string, Map<number, Aggregate>>()
  private readonly ttfts = new Map<string, Array<number>>()
  /** Clears at or after this are in the stats (a whole minute). */
  private statsFrom = Number.NEGATIVE_INFINITY
  /** Raw clears at or after this are kept. */
  private keepFrom = Number.NEGATIVE_INFINITY
  maxId = 0

  constructor(
    /** The stats window (24 h). */
    private readonly statsMs: number,
    /** How long raw clears are kept (at least the longest series window plus a bucket). */
    private readonly keepMs: number
  ) {}

  get size() {
    return this.clears.length
  }

  /** Adds a clear unless it is known or older than what is kept; says whether anything changed. */
  add(c: ClearRecord): boolean {
    if (this.ids.has(c.id) || c.at < this.keepFrom) return false
    this.ids.add(c.id)
    if (c.id > this.maxId) this.maxId = c.id
    const last = this.clears[this.clears.length - 1]
    if (last === undefined || byTime(last, c) <= 0) this.clears.push(c)
    else {
      let i = this.clears.length
      while (i > 0 && byTime(this.clears[i - 1]!, c) > 0) i -= 1
      this.clears.splice(i, 0, c)
    }
    if (c.at >= this.statsFrom) this.count(c)
    return true
  }

  private count(c: ClearRecord) {
    const minute = c.at - (((c.at % MINUTE_MS) + MINUTE_MS) % MINUTE_MS)
    let byMinute = this.minutes.get(c.modelClass)
    if (byMinute === undefined) {
      byMinute = new Map()
      this.minutes.set(c.modelClass, byMinute)
    }
    let agg = byMinute.get(minute)
    if (agg === undefined) {
      agg = emptyAggregate()
      byMinute.set(minute, agg)
    }
    addClear(agg, c)
    let ttfts = this.ttfts.get(c.modelClass)
    if (ttfts === undefined) {
      ttfts = []
      this.ttfts.set(c.modelClass, ttfts)
    }
    ttfts.splice(sortedIndex(ttfts, c.ttftMs), 0, c.ttftMs)
  }

  /** Moves both windows to `now`: what falls out of the stats leaves them, what falls out of keeping goes. */
  roll(now: number) {
    const statsFrom = Math.floor((now - this.statsMs) / MINUTE_MS) * MINUTE_MS
    if (statsFrom > this.statsFrom) {
      const first = lowerBound(this.clears, this.statsFrom)
      const end = lowerBound(this.clears, statsFrom)
      for (let i = first; i < end; i++) {
        const c = this.clears[i]!
        const ttfts = this.ttfts.get(c.modelClass)
        if (ttfts !== undefined) ttfts.splice(sortedIndex(ttfts, c.ttftMs), 1)
      }
      for (const byMinute of this.minutes.values()) {
        for (const minute of byMinute.keys()) if (minute < statsFrom) byMinute.delete(minute)
      }
      this.statsFrom = statsFrom
    }
    const keepFrom = Math.min(statsFrom, now - this.keepMs)
    if (keepFrom > this.keepFrom) {
      const cut = lowerBound(this.clears, keepFrom)
      for (let i = 0; i < cut; i++) this.ids.delete(this.clears[i]!.id)
      if (cut > 0) this.clears = this.clears.slice(cut)
      this.keepFrom = keepFrom
    }
  }

  /** The raw clears in `[from, to)`, oldest first. */
  range(from: number, to: number): ReadonlyArray<ClearRecord> {
    return this.clears.slice(lowerBound(this.clears, from), lowerBound(this.clears, to))
  }

  /** The newest `n` clears, newest first. */
  latest(n: number): ReadonlyArray<ClearRecord> {
    return this.clears.slice(-n).reverse()
  }

  /** Each class's summary over the stats window. */
  stats(classes: ReadonlyArray<string>): Array<ClassStats> {
    return classes.map((modelClass) => {
      const agg = emptyAggregate()
      for (const minute of this.minutes.get(modelClass)?.values() ?? []) mergeAggregate(agg, minute)
      return statsOf(modelClass, agg, this.ttfts.get(modelClass) ?? [])
    })
  }

  /** The index over a grid whose buckets are whole minutes, from the per-minute aggregates. */
  indexByMinutes(classes: ReadonlyArray<string>, grid: Grid): IndexResult {
    return compositeIndexOf(
      classes.map((modelClass) => {
        const buckets = Array.from({ length: grid.points }, emptyAggregate)
        for (const [minute, agg] of this.minutes.get(modelClass) ?? []) {
          if (minute < grid.from || minute >= grid.to) continue
          mergeAggregate(buckets[Math.floor((minute - grid.from) / grid.bucketMs)]!, agg)
        }
        return { modelClass, buckets }
      }),
      grid
    )
  }
}
