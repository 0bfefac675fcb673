import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * The paid path reads its two queue tables, `capacity_leases` and `credit_unfolded`, through their indexes
 * however small the planner last saw them (issue 12, docs/decisions.md D553).
 *
 * Both are queues: every paid call inserts a lease and a capture and deletes them again a few milliseconds
 * later, so under load each gains thousands of dead rows a second until autovacuum comes (once a minute at the
 * default naptime): 123 pages of `capacity_leases` and 263 of `credit_unfolded` 20 s into a bench run. The router's
 * connections live as long as it does (D538) and plan a statement once, generically, when the tables are a page
 * or two, and for a page or two a sequential scan is the cheaper plan. Kept, that plan read every dead row of
 * the table, several times a call (`heap_prepare_pagescan` was 11.6% of the router's Postgres under 50
 * connections). Each function below plans with sequential scans off, so its reads are index probes at any size;
 * a function's plans are cached per connection like a statement's, and its `SET` costs a GUC save and restore
 * a call.
 */
export const queueReads: Migrations = {
  "0042_queue_index_reads": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // The capacity function (0039): each probe of a slot, of the leases above the ceiling and of an expired
    // lease is an index range read on `capacity_leases_slot_held` or `capacity_slots_pkey`. The two slot functions
    // it calls (and nothing else does) plan under its setting, which holds for the whole call.
    yield* sql`ALTER FUNCTION acquire_capacity(TEXT, TEXT, INTEGER, TEXT, INTERVAL) SET enable_seqscan = off`
    // Ends the capacity leases named (any of them not held is skipped): probes of the primary key. Returns how
    // many it ended.
    yield* sql`
      CREATE FUNCTION capacity_release(p_leases TEXT[]) RETURNS INTEGER
      LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
      DECLARE
        n INTEGER;
      BEGIN
        DELETE FROM capacity_leases WHERE lease_id = ANY (p_leases);
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN n;
      END
      $$
    `
    // What a key's captures not folded yet still hold (authorized less charged), as the calling statement's
    // snapshot sees the queue (STABLE: no snapshot of its own): probes of `credit_unfolded_key`.
    yield* sql`
      CREATE FUNCTION credit_unfolded_held(p_key TEXT) RETURNS BIGINT
      LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $$
      BEGIN
        RETURN (SELECT coalesce(sum(authorized - charged), 0) FROM credit_unfolded WHERE key_id = p_key);
      END
      $$
    `
  })
}
