import { Deferred, Effect } from "effect"

/** A batch still open: its items in the order they came, and its answer once sent. */
export interface OpenBatch<I, R> {
  readonly items: ReadonlyArray<I>
  /** Waits for the batch's answer. */
  readonly answered: Effect.Effect<R>
}

export interface TurnBatches<K, I, R> {
  /**
   * Adds `item` to its key's batch of this turn, opening one if none is open: the batch's answer and the
   * item's place in it. `undefined` once the batches are closed (the scope that made them is closing): the
   * caller then does the item's work alone.
   */
  readonly add: (key: K, item: I) => Effect.Effect<{ readonly answer: R; readonly index: number } | undefined>
  /** The key's batch still open in this turn, if any. */
  readonly open: (key: K) => OpenBatch<I, R> | undefined
}

/**
 * Work that becomes ready in the same turn of the event loop, grouped by a key and sent as one (the group
 * commit of D370, D545). The first item of a key opens its batch and forks its send, which runs once the
 * fibers ready in this turn have run and added theirs: nothing waits for a timer, so a lone item goes at
 * once and a busy turn's items share one statement. `send` must not fail (it answers every item, failures
 * included, in `R`) and runs uninterruptibly: a batch taken is a batch answered. When the scope that made
 * the batches closes, every batch still open is sent before the close goes on, and items added later get
 * `undefined`.
 */
export const makeTurnBatches = <K, I, R>(send: (key: K, items: ReadonlyArray<I>) => Effect.Effect<R>) =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    interface Batch {
      readonly items: Array<I>
      readonly done: Deferred.Deferred<R>
      readonly view: OpenBatch<I, R>
    }
    const batches = new Map<K, Batch>()
    let closed = false

    const sendOpen = (key: K, batch: Batch) =>
      Effect.suspend(() => {
        if (batches.get(key) !== batch) return Effect.void
        batches.delete(key)
        return Effect.flatMap(
          Effect.suspend(() => send(key, batch.items)),
          (answer) => Deferred.succeed(batch.done, answer)
        )
      }).pipe(Effect.uninterruptible)

    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        closed = true
        return Effect.forEach([...batches], ([key, batch]) => sendOpen(key, batch), { discard: true })
      })
    )

    const add = (key: K, item: I) =>
      Effect.suspend(() => {
        if (closed) return Effect.succeed(undefined)
        const current = batches.get(key)
        const batch: Batch = current ?? newBatch()
        const index = batch.items.push(item) - 1
        const answer = Effect.map(Deferred.await(batch.done), (answer) => ({ answer, index }))
        if (current !== undefined) return answer
        batches.set(key, batch)
        return Effect.andThen(
          Effect.forkIn(Effect.andThen(Effect.yieldNow, sendOpen(key, batch)), scope),
          answer
        )
      })

    const newBatch = (): Batch => {
      const items: Array<I> = []
      const done = Deferred.makeUnsafe<R>()
      return { items, done, view: { items, answered: Deferred.await(done) } }
    }

    return {
      add,
      open: (key) => batches.get(key)?.view
    } satisfies TurnBatches<K, I, R>
  })
