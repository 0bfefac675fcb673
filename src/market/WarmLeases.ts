/**
 * Capacity leases an instance keeps warm between requests (D555): a lease row whose request ended is held
 * here, idle, for at most `idleMs`, and the next request on the same (provider, class) takes it over without
 * a round trip: the row, its slot and its expiry stay as they were, so every instance still counts it against
 * the ceiling. A lease past `idleMs` idle is given back (its row deleted), and so is one too old to carry a
 * whole request inside its expiry, or taken under a ceiling higher than the quote's now, or written before a
 * gap in the instance's heartbeat (a survivor may have released its row meanwhile). Pure bookkeeping:
 * the caller deletes what `idle`, `drain` and a refused `put` hand back.
 */

/** A lease row held by this instance with no request on it. */
export interface WarmLease {
  readonly leaseId: string
  /** The signed ceiling it was taken under: its slot is below it. */
  readonly capacity: number
  /** When its row was written (its expiry is that plus the lease TTL). */
  readonly takenAt: number
}

export interface WarmSettings {
  /** How long a lease may wait idle for the next request before its row is deleted; 0 keeps none. */
  readonly idleMs: number
  /** The oldest a lease may be and still be taken over: its TTL less the longest request, with a margin. */
  readonly reuseMs: number
  /** At most this many idle leases per (provider, class). */
  readonly perKey: number
}

interface Idle extends WarmLease {
  readonly idleSince: number
}

export class WarmLeases {
  // Per (provider, class), the most recently idled last: takers take the freshest, the oldest age out.
  private readonly byKey = new Map<string, Array<Idle>>()
  private size_ = 0
  private closed = false
  // Leases written before this are not reused (their rows may have been released by a survivor; `standSince`).
  private floor = Number.NEGATIVE_INFINITY

  readonly settings: WarmSettings

  constructor(settings: WarmSettings) {
    this.settings = settings
  }

  get size() {
    return this.size_
  }

  // Young enough to carry a whole request inside its expiry, and written since the instance was last seen alive.
  private standing(lease: WarmLease, nowMs: number) {
    return nowMs - lease.takenAt < this.settings.reuseMs && lease.takenAt >= this.floor
  }

  private usable(lease: WarmLease, capacity: number, nowMs: number) {
    return lease.capacity <= capacity && this.standing(lease, nowMs)
  }

  /**
   * Only leases written at or after `sinceMs` still certainly have their rows (the time since when this
   * instance has been seen alive without a gap; +Infinity during one): the idle leases written before it are
   * removed and returned, and none of them is kept from now on. Called with the same time, it does nothing.
   */
  standSince(sinceMs: number): Array<string> {
    if (sinceMs === this.floor) return []
    this.floor = sinceMs
    const out: Array<string> = []
    for (const [key, idle] of this.byKey) {
      const kept = idle.filter((lease) => lease.takenAt >= sinceMs)
      if (kept.length === idle.length) continue
      for (const lease of idle) if (lease.takenAt < sinceMs) out.push(lease.leaseId)
      this.size_ -= idle.length - kept.length
      if (kept.length === 0) this.byKey.delete(key)
      else this.byKey.set(key, kept)
    }
    return out
  }

  /** Whether `take` would find a lease now (the reservation then asks for none). */
  has(key: string, capacity: number, nowMs: number): boolean {
    return this.byKey.get(key)?.some((lease) => this.usable(lease, capacity, nowMs)) === true
  }

  /**
   * The freshest idle lease of `key` a request under `capacity` may hold, removed from the pool; leases passed
   * over on the way (too old, or above a lowered ceiling) are handed to `drop` to be deleted.
   */
  take(key: string, capacity: number, nowMs: number, drop: (leaseId: string) => void): WarmLease | undefined {
    const idle = this.byKey.get(key)
    if (idle === undefined) return undefined
    while (idle.length > 0) {
      const lease = idle.pop()!
      this.size_--
      if (this.usable(lease, capacity, nowMs)) return lease
      drop(lease.leaseId)
    }
    return undefined
  }

  /** Whether a lease whose request ends now may go back warm (on, not stopping, and standing). */
  wouldKeep(lease: WarmLease, nowMs: number): boolean {
    return !this.closed && this.settings.idleMs > 0 && this.standing(lease, nowMs)
  }

  /** Keeps a lease whose request ended; false when it must be deleted instead (closed, full, too old, or off). */
  put(key: string, lease: WarmLease, nowMs: number): boolean {
    if (!this.wouldKeep(lease, nowMs)) return false
    let idle = this.byKey.get(key)
    if (idle === undefined) {
      idle = []
      this.byKey.set(key, idle)
    }
    if (idle.length >= this.settings.perKey) return false
    idle.push({ ...lease, idleSince: nowMs })
    this.size_++
    return true
  }

  /** Removes and returns the leases idle for `idleMs` or more (the oldest of each key are first in line). */
  idle(nowMs: number): Array<string> {
    const out: Array<string> = []
    for (const [key, idle] of this.byKey) {
      let n = 0
      while (n < idle.length && nowMs - idle[n]!.idleSince >= this.settings.idleMs) n++
      if (n === 0) continue
      for (const lease of idle.splice(0, n)) out.push(lease.leaseId)
      this.size_ -= n
      if (idle.length === 0) this.byKey.delete(key)
    }
    return out
  }

  /** Every idle lease, removed; after it nothing more is kept (the instance is stopping). */
  drain(): Array<string> {
    this.closed = true
    const out: Array<string> = []
    for (const idle of this.byKey.values()) for (const lease of idle) out.push(lease.leaseId)
    this.byKey.clear()
    this.size_ = 0
    return out
  }
}
