/**
 * The finished streams a process keeps for replay, in the order they finished, with what each keeps, held
 * within a byte budget: past it, the oldest whose work has ended go first (D548). Pure: the registry says which
 * streams may go and takes them out of its map.
 */

/**
 * What a finished stream costs beside its kept reply's bytes: its record, its id and token hash, the reply's
 * headers and wrappers, its place in the registry's map (a heap snapshot difference: about 2.6 KB of heap for a
 * non-streamed reply of about 1.3 KB, D548).
 */
export const RECORD_BYTES = 2048

export interface Kept {
  readonly body: Uint8Array
  readonly offsets: Uint32Array | undefined
}

export const keptBytesOf = (kept: Kept) =>
  kept.body.byteLength + (kept.offsets?.byteLength ?? 0) + RECORD_BYTES

interface Entry<S> {
  readonly stream: S
  readonly bytes: number
  readonly finishedAt: number
}

export class FinishedStreams<S> {
  private readonly queue: Array<Entry<S>> = []
  private head = 0
  /** Older than the queue's head: streams the trim passed while their work was still ending, oldest first. */
  private parked: Array<Entry<S>> = []
  /** The bytes of the streams kept, counted when each finished. */
  bytes = 0
  readonly budget: number

  constructor(budget: number) {
    this.budget = budget
  }

  get size() {
    return this.queue.length - this.head + this.parked.length
  }

  /** A stream that finished at `finishedAt` keeping `bytes`. */
  add(stream: S, bytes: number, finishedAt: number) {
    this.queue.push({ stream, bytes, finishedAt })
    this.bytes += bytes
  }

  /**
   * Takes the oldest out, each told to `drop`, while the bytes are over the budget or the oldest finished
   * before `expiredBefore`. A stream whose work has not ended (`done`) is never taken: it is passed over and
   * kept aside, and goes first once its work has ended and the trim asks for room or its age again.
   */
  trim(done: (stream: S) => boolean, drop: (stream: S) => void, expiredBefore = Number.NEGATIVE_INFINITY) {
    const due = (entry: Entry<S>) => this.bytes > this.budget || entry.finishedAt < expiredBefore
    const take = (entry: Entry<S>) => {
      this.bytes -= entry.bytes
      drop(entry.stream)
    }
    if (this.parked.length > 0) {
      const still: Array<Entry<S>> = []
      for (const entry of this.parked) {
        if (due(entry) && done(entry.stream)) take(entry)
        else still.push(entry)
      }
      this.parked = still
    }
    while (this.head < this.queue.length) {
      const oldest = this.queue[this.head]!
      if (!due(oldest)) break
      this.head++
      if (done(oldest.stream)) take(oldest)
      else this.parked.push(oldest)
    }
    // The taken entries' slots are let go once they are most of the array.
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue.splice(0, this.head)
      this.head = 0
    }
  }
}
