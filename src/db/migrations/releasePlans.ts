import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * `capacity_release` (0042) planned its delete afresh on every call (issue 12, docs/decisions.md D567). A settling
 * statement calls it for its batch's leases, and with warm leases (D555) that list is usually empty; each call
 * still ran the delete, and a PL/pgSQL statement over an array parameter keeps choosing a custom plan (its
 * generic plan's estimate for an array of unknown length never beats the one-element custom plans): about 0.1 ms
 * of planning a settling statement in `bench:pgwork`, for nothing. An empty list now returns at once, and the
 * delete keeps one generic plan per connection (a probe of the primary key for each id).
 */
export const releasePlans: Migrations = {
  "0044_release_plans": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      CREATE OR REPLACE FUNCTION capacity_release(p_leases TEXT[]) RETURNS INTEGER
      LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
      DECLARE
        n INTEGER;
      BEGIN
        IF coalesce(cardinality(p_leases), 0) = 0 THEN
          RETURN 0;
        END IF;
        DELETE FROM capacity_leases WHERE lease_id = ANY (p_leases);
        GET DIAGNOSTICS n = ROW_COUNT;
        RETURN n;
      END
      $$
    `
  })
}
