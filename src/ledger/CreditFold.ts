import { Config, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { passWhenWoken, type Wake } from "../Background.ts"
import { commitWithoutFlush } from "../db/AsyncCommit.ts"

/** How often captured credit requests are folded into their key's and owner's rows (a test lengthens it). */
const foldEveryMs = Config.Int("CREDIT_FOLD_EVERY_MS").pipe(Config.withDefault(50))
/**
 * With nothing captured here since, a pass runs only this often: what another instance left (one that
 * died before folding) is folded within it. An idle router no longer sends a fold statement every 50 ms.
 */
const SWEEP_EVERY_MS = 2_000
/** Passes owed after a credit capture here: a fold that found the lock taken is tried again, twice. */
const PASSES_AFTER_CAPTURE = 3
/** At most this many captures a statement; a pass runs statements until the queue is empty. */
const FOLD_BATCH = 5000
/** The advisory lock one fold at a time holds (any instance): two folds never wait on each other's rows. */
export const FOLD_LOCK = 7_403_315

/**
 * The fold (D315): a credit capture (or release) does not touch the key's row or its owner's balance row;
 * it inserts its request into `credit_unfolded` (`Capture.ts`). A pass takes what is queued and applies
 * it in one statement: each key `reserved −= Σ authorized, spent += Σ charged`, each owner's balance
 * `reserved −= Σ authorized, available += Σ (authorized − charged)`, the queue rows deleted in the same
 * transaction, so a capture is folded exactly once whoever folds it and whenever: every instance runs
 * the pass (one at a time, by an advisory lock), so what a dead instance captured is folded by the
 * others, or by its own restart. Until folded a capture's worst case stays reserved: the rows lag in the
 * safe direction only. Readers of the figures read the views `key_figures` and `balance_figures`, which
 * count what is not folded yet (migration 0033).
 */
export const makeCreditFold = (sql: SqlClient.SqlClient) => {
  /**
   * A fold's commit does not wait for the disk (D542): lost in a crash of the database server, it takes
   * the queue rows it deleted with it, so the next fold applies them again, and readers see the same
   * figures either way (they count the queue). It held a key's row locked through that wait, which every
   * reservation on the key queued behind.
   */
  const flushLater = commitWithoutFlush(sql)

  /**
   * One statement: with the lock (`wait`: for it, else only if free) the queue's rows are deleted and
   * their sums applied, keys before balances (the order a reservation locks them in: the balances'
   * update reads `keys`, so it runs after it). Returns how many captures it folded.
   */
  const foldOnce = (wait: boolean) => {
    const lock = wait
      ? sql`(SELECT true FROM (SELECT pg_advisory_xact_lock(${FOLD_LOCK})) l)`
      : sql`(SELECT pg_try_advisory_xact_lock(${FOLD_LOCK}))`
    return sql<{ folded: number }>`
      WITH taken AS (
        DELETE FROM credit_unfolded WHERE request_id IN (
          SELECT request_id FROM credit_unfolded WHERE ${lock}
          LIMIT ${FOLD_BATCH} FOR UPDATE SKIP LOCKED
        )
        RETURNING key_id, wallet, authorized, charged
      ), keys AS (
        UPDATE api_keys k
        SET reserved = k.reserved - t.authorized, spent = k.spent + t.charged,
            folded = k.folded + t.authorized - t.charged
        FROM (SELECT key_id, sum(authorized) AS authorized, sum(charged) AS charged FROM taken GROUP BY key_id) t
        WHERE k.key_id = t.key_id
        RETURNING k.key_id
      ), balances_locked AS (
        -- The owners' rows locked in wallet order, as the refunds pass credits them (\`Refunds.ts\`): two
        -- writers of several balance rows never take two of them in opposite orders.
        SELECT count(*) FROM (
          SELECT 1 FROM wallet_balances WHERE wallet IN (SELECT wallet FROM taken) ORDER BY wallet FOR UPDATE
        ) l
      ), balances AS (
        UPDATE wallet_balances b
        SET reserved = b.reserved - t.authorized, available = b.available + t.authorized - t.charged,
            updated_at = now()
        FROM (SELECT wallet, sum(authorized) AS authorized, sum(charged) AS charged FROM taken GROUP BY wallet) t
        WHERE b.wallet = t.wallet AND (SELECT count(*) FROM keys) >= 0 AND (SELECT * FROM balances_locked) >= 0
      )
      SELECT count(*)::int AS folded, ${flushLater} FROM taken
    `.pipe(
      // Keys and balances are locked in whatever order the plan takes them; a transaction of another
      // writer that holds two of them in the other order can meet this one in a deadlock (Postgres
      // aborts one). The statement is atomic, so it is run again.
      Effect.retry({ while: (error) => error.reason._tag === "DeadlockError", times: 3 }),
      Effect.map((rows) => rows[0]?.folded ?? 0)
    )
  }

  /** Folds until the queue is empty (or, without `wait`, another fold holds the lock). */
  const foldAll = (wait: boolean) =>
    Effect.gen(function* () {
      let total = 0
      while (true) {
        const folded = yield* foldOnce(wait)
        total += folded
        if (folded < FOLD_BATCH) return total
      }
    })

  // The background pass folds while this instance has captured (`queued`), else once per sweep interval; an
  // idle router does not wake for it in between (D572).
  let passesOwed = 1
  let wake: Wake = () => {}
  const pass = Effect.suspend(() => {
    passesOwed = Math.max(0, passesOwed - 1)
    return foldAll(false)
  })

  return {
    /** A credit capture or release was queued here: the next passes fold it (no statement of its own). */
    queued: () => {
      passesOwed = PASSES_AFTER_CAPTURE
      wake()
    },
    /** Everything captured before the call is folded when it returns (waits for a fold under way). */
    foldNow: foldAll(true).pipe(Effect.orDie, Effect.withSpan("Ledger.foldCredit")),
    /**
     * The background pass (50 ms after the start or a capture, then every 50 ms while passes are owed, every
     * 2 s when none are) and a last one when the layer closes (shutdown).
     */
    start: Effect.gen(function* () {
      const every = yield* foldEveryMs
      wake = yield* passWhenWoken(pass, {
        every: `${every} millis`,
        pending: () => passesOwed > 0,
        idleEvery: `${SWEEP_EVERY_MS} millis`,
        failure: "folding credit captures failed"
      })
      yield* Effect.addFinalizer(() => Effect.ignore(foldAll(true)))
    })
  }
}
