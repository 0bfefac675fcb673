import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * The payouts pass reads only the shares it can pay (issue 12, docs/decisions.md D509–D512): the unpaid
 * provider shares of ended epochs, by an index that starts at the epoch.
 */
export const payoutScan: Migrations = {
  "0037_requests_epoch": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // A settled request's epoch: its receipt's `epoch_id`, written by the statement that settles it and
    // inserts that receipt (ledger/Capture.ts, ledger/SettleBatch.ts); NULL while reserved, and for a
    // deposit (no receipt, never paid out). Existing rows take their receipt's (D509).
    yield* sql`ALTER TABLE requests ADD COLUMN epoch_id BIGINT`
    yield* sql`
      UPDATE requests q SET epoch_id = r.epoch_id FROM receipts r
      WHERE r.request_id = q.request_id AND q.epoch_id IS NULL
    `
    // The unpaid shares by epoch: a pass at epoch E reads `epoch_id < E`, never the current epoch's
    // (D510). Replaces `(provider_id)` over the same rows, so a request still has one entry in it.
    yield* sql`DROP INDEX requests_share_unpaid`
    yield* sql`
      CREATE INDEX requests_share_unpaid ON requests (epoch_id, provider_id)
      WHERE status = 'captured' AND payout_id IS NULL AND dialect <> 'deposit'
    `
  })
}
