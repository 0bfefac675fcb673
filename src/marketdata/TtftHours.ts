/**
 * TTFTs counted in fixed histograms, one per key (a class, a provider) and hour, so that what is kept does not
 * grow with the number of clears (D549). Values below 128 ms are counted exactly; above, 64 buckets an octave
 * (within 1.6% of the value) up to 2^20 ms, past which a value counts as the largest bucket. A quantile is the
 * nearest-rank one over the buckets, answered as its bucket's least value.
 */
const EXACT = 128
const PER_OCTAVE = 64
/** log2 of `EXACT`: the first octave counted in buckets. */
const FIRST_OCTAVE = 7
const LAST_OCTAVE = 19
export const TTFT_BUCKETS = EXACT + (LAST_OCTAVE - FIRST_OCTAVE + 1) * PER_OCTAVE
const HOUR_MS = 3_600_000

export const ttftBucket = (ms: number): number => {
  const v = Math.min(Math.max(0, Math.floor(ms)), 2 ** (LAST_OCTAVE + 1) - 1)
  if (v < EXACT) return v
  const octave = 31 - Math.clz32(v)
  return EXACT + (octave - FIRST_OCTAVE) * PER_OCTAVE + Math.floor((v - 2 ** octave) / 2 ** (octave - 6))
}

/** The least value of a bucket. */
export const bucketFloor = (bucket: number): number => {
  if (bucket < EXACT) return bucket
  const octave = FIRST_OCTAVE + Math.floor((bucket - EXACT) / PER_OCTAVE)
  return 2 ** octave + ((bucket - EXACT) % PER_OCTAVE) * 2 ** (octave - 6)
}

/** A value as the histograms count it: the least value of its bucket. */
export const countedTtft = (ms: number) => bucketFloor(ttftBucket(ms))

interface Keyed {
  readonly hours: Map<number, Uint32Array>
  /** The sum of the hours kept. */
  readonly total: Uint32Array
  size: number
}

export class TtftHours {
  private readonly byKey = new Map<string, Keyed>()

  add(key: string, at: number, ttftMs: number) {
    let keyed = this.byKey.get(key)
    if (keyed === undefined) {
      keyed = { hours: new Map(), total: new Uint32Array(TTFT_BUCKETS), size: 0 }
      this.byKey.set(key, keyed)
    }
    const hour = at - (((at % HOUR_MS) + HOUR_MS) % HOUR_MS)
    let counts = keyed.hours.get(hour)
    if (counts === undefined) {
      counts = new Uint32Array(TTFT_BUCKETS)
      keyed.hours.set(hour, counts)
    }
    const bucket = ttftBucket(ttftMs)
    counts[bucket]! += 1
    keyed.total[bucket]! += 1
    keyed.size += 1
  }

  /** Lets go of the hours that end at or before `from` (no minute of them at or after it). */
  roll(from: number) {
    for (const [key, keyed] of this.byKey) {
      for (const [hour, counts] of keyed.hours) {
        if (hour + HOUR_MS > from) continue
        for (let b = 0; b < TTFT_BUCKETS; b++) {
          const n = counts[b]!
          if (n === 0) continue
          keyed.total[b]! -= n
          keyed.size -= n
        }
        keyed.hours.delete(hour)
      }
      if (keyed.size === 0) this.byKey.delete(key)
    }
  }

  /** The nearest-rank quantile of `key`'s TTFTs kept, as its bucket's least value; null when none. */
  quantile(key: string, q: number): number | null {
    const keyed = this.byKey.get(key)
    if (keyed === undefined || keyed.size === 0) return null
    const rank = Math.max(1, Math.ceil(q * keyed.size))
    let seen = 0
    for (let b = 0; b < TTFT_BUCKETS; b++) {
      seen += keyed.total[b]!
      if (seen >= rank) return bucketFloor(b)
    }
    return bucketFloor(TTFT_BUCKETS - 1)
  }
}
