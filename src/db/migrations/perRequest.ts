import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * Less database work per paid request (issue 12, docs/decisions.md D440–D449): what `npm run bench:pgwork`
 * counted a request writing that no reader needed.
 */
export const perRequest: Migrations = {
  "0036_per_request_writes": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // Index entries no query needs (D441). `receipts_epoch (epoch_id)` is the prefix of `receipts_epoch_leaf
    // (epoch_id, leaf_index)`, which answers every query by epoch; the open reservations of an instance
    // are found through `requests_in_flight` (every reserved request: the ones in flight), and a dead
    // instance's capacity leases by reading the lease table (the leases in flight). Each was an index
    // entry per request (receipts: two, its insert and its signing), on the rare paths read at most a
    // few thousand rows instead.
    yield* sql`DROP INDEX receipts_epoch`
    yield* sql`DROP INDEX requests_reserved_instance`
    yield* sql`DROP INDEX capacity_leases_instance`
    // The sweep reads unsigned receipts whose settlement is known (`landed`, `none`): an x402 receipt is
    // stored `pending` and unsigned until its transfer lands, then rewritten signed, so it was an entry the
    // sweep never read. The index now holds exactly what the sweep asks for (D444).
    yield* sql`DROP INDEX receipts_unsigned`
    yield* sql`
      CREATE INDEX receipts_unsigned ON receipts (created_at)
      WHERE signature IS NULL AND body->>'settlement' IN ('landed', 'none')
    `
    // A payer's `x402_outstanding` row was written twice per reservation: the guard's upsert locked it by
    // writing it unchanged, then the insert trigger added the value (D442). The guard now adds the value
    // itself and says so on the authorization (`outstanding_counted`), which the insert trigger leaves
    // alone; an authorization inserted by anyone else is counted by the trigger as before.
    yield* sql`ALTER TABLE x402_authorizations ADD COLUMN outstanding_counted BOOLEAN NOT NULL DEFAULT false`
    // And the trigger runs only for a change that moves the payer's sum (D443): `reserved` → `pending` →
    // `submitted` keeps the value committed, and was a trigger call each that wrote nothing.
    yield* sql`DROP TRIGGER x402_outstanding_track ON x402_authorizations`
    yield* sql`
      CREATE TRIGGER x402_outstanding_insert AFTER INSERT ON x402_authorizations FOR EACH ROW
      WHEN (NOT NEW.outstanding_counted AND NEW.status IN ('reserved', 'pending', 'submitted'))
      EXECUTE FUNCTION x402_outstanding_track()
    `
    yield* sql`
      CREATE TRIGGER x402_outstanding_update AFTER UPDATE OF status, value, payer ON x402_authorizations
      FOR EACH ROW
      WHEN ((OLD.status IN ('reserved', 'pending', 'submitted')) IS DISTINCT FROM
              (NEW.status IN ('reserved', 'pending', 'submitted'))
            OR OLD.value IS DISTINCT FROM NEW.value OR OLD.payer IS DISTINCT FROM NEW.payer)
      EXECUTE FUNCTION x402_outstanding_track()
    `
    yield* sql`
      CREATE TRIGGER x402_outstanding_delete AFTER DELETE ON x402_authorizations FOR EACH ROW
      WHEN (OLD.status IN ('reserved', 'pending', 'submitted'))
      EXECUTE FUNCTION x402_outstanding_track()
    `
  })
}
