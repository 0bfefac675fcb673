import type { SqlClient } from "effect/sql"

/**
 * A column for a statement's last SELECT that makes the statement's own commit not wait for the WAL to reach
 * the disk (`synchronous_commit` off for that transaction only; the connection's next statement waits as
 * usual). The commit is visible to every other statement at once, as any commit; only its durability waits:
 * the WAL writer flushes it within three `wal_writer_delay`s (600 ms), and any later commit that waits for
 * the disk flushes it first, the WAL being one sequence (D542).
 *
 * Only for a statement whose loss in a crash of the database server leaves the book consistent and costs
 * no one money they are owed, and that no earlier commit points at: a key's or an x402 authorization's
 * reservation (lost with it: a call served and not charged, since its capture, which waits, finds nothing to
 * settle; not a session turn's, whose claim on its session is committed first) and the credit fold (lost with it: the queue rows it
 * deleted, so the next fold applies them again; readers count the queue either way, D316).
 */
export const commitWithoutFlush = (sql: SqlClient.SqlClient) =>
  sql`set_config('synchronous_commit', 'off', true) AS commit_flush`
