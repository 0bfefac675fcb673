import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * A statement that inserts receipts moves their points once per wallet and once per provider shard, not once per
 * receipt (issue 12, docs/decisions.md D546).
 */
export const statementPoints: Migrations = {
  "0040_statement_points": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // What the row trigger's INSERT case did for each receipt, summed over the statement's receipts: a wallet's
    // settled and pending charges (a wallet whose sums are both zero is not written), a provider shard's charges,
    // receipts and receipts `ok`. Wallets first, in wallet order, then shards in (provider, shard) order: the
    // order a settling batch of one wallet took them in, receipt by receipt (D370), so no lock order changes.
    yield* sql`
      CREATE FUNCTION points_receipts_inserted() RETURNS trigger
      LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO points_wallets AS p (wallet, settled_charged, pending_charged)
        SELECT wallet, sum(settled), sum(pending) FROM (
          SELECT lower(body->>'wallet') AS wallet,
                 CASE WHEN body->>'settlement' = 'landed' THEN (body->>'charged')::bigint ELSE 0 END AS settled,
                 CASE WHEN body->>'settlement' = 'pending' THEN (body->>'charged')::bigint ELSE 0 END AS pending
          FROM inserted_receipts
        ) r
        GROUP BY wallet HAVING sum(settled) <> 0 OR sum(pending) <> 0
        ORDER BY wallet
        ON CONFLICT (wallet) DO UPDATE
        SET settled_charged = p.settled_charged + EXCLUDED.settled_charged,
            pending_charged = p.pending_charged + EXCLUDED.pending_charged;
        INSERT INTO points_providers AS p (provider_id, shard, settled_charged, pending_charged, receipts, receipts_ok)
        SELECT provider_id, shard, sum(settled), sum(pending), count(*), sum(ok) FROM (
          SELECT body->>'provider_id' AS provider_id, hashtext(request_id) & 7 AS shard,
                 CASE WHEN body->>'settlement' = 'landed' THEN (body->>'charged')::bigint ELSE 0 END AS settled,
                 CASE WHEN body->>'settlement' = 'pending' THEN (body->>'charged')::bigint ELSE 0 END AS pending,
                 CASE WHEN body->>'status' = 'ok' THEN 1 ELSE 0 END AS ok
          FROM inserted_receipts
        ) r
        GROUP BY provider_id, shard
        ORDER BY provider_id, shard
        ON CONFLICT (provider_id, shard) DO UPDATE
        SET settled_charged = p.settled_charged + EXCLUDED.settled_charged,
            pending_charged = p.pending_charged + EXCLUDED.pending_charged,
            receipts = p.receipts + EXCLUDED.receipts,
            receipts_ok = p.receipts_ok + EXCLUDED.receipts_ok;
        RETURN NULL;
      END
      $$
    `
    // The row trigger keeps the updates and deletes (a landing, a repair), one receipt at a time as before.
    yield* sql`DROP TRIGGER receipts_points ON receipts`
    yield* sql`
      CREATE TRIGGER receipts_points AFTER DELETE OR UPDATE OF body ON receipts
      FOR EACH ROW EXECUTE FUNCTION points_receipt_changed()
    `
    yield* sql`
      CREATE TRIGGER receipts_points_inserted AFTER INSERT ON receipts
      REFERENCING NEW TABLE AS inserted_receipts
      FOR EACH STATEMENT EXECUTE FUNCTION points_receipts_inserted()
    `
  })
}
