import { Deferred, Effect, type Exit } from "effect"

/** A batch still open: its items in the order they came, and its answer once sent. */
export interface OpenBatch<I, R> {
  readonly items: ReadonlyArray<I>
  /** Waits for the batch's answer. */
  readonly answered: Effect.Effect<R>
}

export interface TurnBatches<K, I, R> {
  /**
   * Adds `item` to its key's batch of this turn, opening one if none is open (or the open one is full): the
   * batch's answer and the item's place in it. `undefined` once the batches are closed (the scope that made
   * them is closing): the caller then does the item's work alone.
   */
  readonly add: (key: K, item: I) => Effect.Effect<{ readonly answer: R; readonly index: number } | undefined>
  /** The key's batch still open in this turn, if any. */
  readonly open: (key: K) => OpenBatch<I, R> | undefined
}

/**
 * Work that becomes ready in the same turn of the event loop, grouped by a key and sent as one (the group
 * commit of D370, D545). The first item of a batch opens it and forks its send, which runs once the fibers
 * ready in this turn have run and added theirs: nothing waits for a timer, so a lone item goes at once and a
 * busy turn's items share one statement, at most `maxItems` a batch (a full batch is sent as it stands and the
 * next item opens another). `send` answers every item, failures included, in `R`; it runs uninterruptibly, and
 * whatever way it ends reaches every caller of its batch (a defect in it is theirs), so a batch taken is a
 * batch answered. When the scope that made the batches closes, every batch not yet sent is sent before the
 * close goes on, and items added later get `undefined`.
 *
 * With `lingerMs` above zero a batch waits that long after its first item instead of the turn's end, so items
 * of later turns join it too (D573: work whose caller does not wait for it, gathered at rates where turns
 * rarely share anything); a batch that fills up is still sent at once, and the close sends it at once.
 */
export const makeTurnBatches = <K, I, R>(
  send: (key: K, items: ReadonlyArray<I>) => Effect.Effect<R>,
  maxItems = 64,
  lingerMs = 0
) =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    interface Batch {
      readonly key: K
      readonly items: Array<I>
      readonly done: Deferred.Deferred<R>
      readonly view: OpenBatch<I, R>
    }
    /** The batch each key's next item joins. */
    const open = new Map<K, Batch>()
    /** Every batch not sent yet: the open ones and the full ones waiting for their turn's end. */
    const unsent = new Set<Batch>()
    let closed = false

    const sendOnce = (batch: Batch) =>
      Effect.suspend(() => {
        if (!unsent.delete(batch)) return Effect.void
        if (open.get(batch.key) === batch) open.delete(batch.key)
        return Effect.flatMap(
          Effect.exit(Effect.suspend(() => send(batch.key, batch.items))),
          (exit: Exit.Exit<R>) => Deferred.done(batch.done, exit)
        )
      }).pipe(Effect.uninterruptible)

    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        closed = true
        return Effect.forEach([...unsent], sendOnce, { discard: true })
      })
    )

    const newBatch = (key: K): Batch => {
      const items: Array<I> = []
      const done = Deferred.makeUnsafe<R>()
      return { key, items, done, view: { items, answered: Deferred.await(done) } }
    }

    const add = (key: K, item: I) =>
      Effect.suspend(() => {
        if (closed) return Effect.succeed(undefined)
        const current = open.get(key)
        const joins = current !== undefined && current.items.length < maxItems
        const batch: Batch = joins ? current : newBatch(key)
        const index = batch.items.push(item) - 1
        const answer = Effect.map(Deferred.await(batch.done), (answer) => ({ answer, index }))
        // A batch this item filled goes at the end of this turn, whether or not it lingers.
        const full = batch.items.length >= maxItems
        if (joins && (lingerMs <= 0 || !full)) return answer
        if (!joins) {
          open.set(key, batch)
          unsent.add(batch)
        }
        const wait = lingerMs > 0 && !full ? Effect.sleep(lingerMs) : Effect.yieldNow
        return Effect.andThen(Effect.forkIn(Effect.andThen(wait, sendOnce(batch)), scope), answer)
      })

    return {
      add,
      open: (key) => open.get(key)?.view
    } satisfies TurnBatches<K, I, R>
  })
