import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"
import { clearFunctions } from "./statementClears.ts"

/**
 * Each wallet's hourly spend, for the customer leaderboard (issue 12, docs/decisions.md D559), which summed 30
 * days of `market_clears` on every call of a public endpoint.
 */
export const walletHours: Migrations = {
  "0043_wallet_hours": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One row per wallet and hour it cleared in: its spend (Σ charged, base units) and requests. The leaderboard
    // reads a window's hours by the primary key's leading column.
    yield* sql`
      CREATE TABLE market_wallet_hours (
        hour_ms BIGINT NOT NULL,
        wallet TEXT NOT NULL,
        spend BIGINT NOT NULL,
        requests BIGINT NOT NULL,
        PRIMARY KEY (hour_ms, wallet)
      )
    `
    // The clears written so far, in the same transaction as the functions that write the next ones: another
    // instance still settling with the old functions waits here (its clears are then in the sum) or after (its
    // settling statements run the new ones), so no clear is counted twice or missed. The lock is on `receipts`
    // first (D564): a settling statement takes it as it starts, before its trigger looks up the function it
    // runs, so one that waits runs the new function. Locking `market_clears` alone let a trigger already
    // running the old function wait at its clears, then write them with no wallet hours after the backfill.
    // Receipts, then clears: the order a settling statement takes them in.
    yield* sql`LOCK TABLE receipts IN SHARE ROW EXCLUSIVE MODE`
    yield* sql`LOCK TABLE market_clears IN SHARE ROW EXCLUSIVE MODE`
    yield* sql.unsafe(WALLET_HOURS_OF_CLEARS)
    for (const replaced of clearFunctions(true)) yield* sql.unsafe(replaced)
  })
}

/**
 * The wallet hours of the clears the leaderboard's window can still read (from the hour holding 30 days ago, and
 * an hour before for another instance's clock), as the settling statements sum them. `market_clears` is kept for
 * good: older hours would be pruned on the next pass, and summing them held the settlements' lock the longer.
 */
export const WALLET_HOURS_OF_CLEARS = `
  INSERT INTO market_wallet_hours (hour_ms, wallet, spend, requests)
  SELECT at_ms - at_ms % 3600000, wallet, sum(charged), count(*)
  FROM market_clears
  WHERE at_ms >= ((extract(epoch FROM now()) * 1000)::bigint - 2592000000) / 3600000 * 3600000 - 3600000
  GROUP BY 1, 2
`
