import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * A settlement that finds its nonce spent looks at every transaction ever recorded for it, whatever its
 * record says, before it calls the payment unpaid (issue 12 follow-up, docs/decisions.md D533).
 */
export const settlementEvidence: Migrations = {
  "0038_outgoing_purpose": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // `outgoing_transactions_live_purpose` holds only the live records; this one holds them all.
    yield* sql`CREATE INDEX outgoing_transactions_purpose ON outgoing_transactions (purpose)`
  })
}
