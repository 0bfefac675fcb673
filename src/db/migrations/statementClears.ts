import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * Each wallet's spend and requests per hour, summed over the statement's clears and upserted once per (hour,
 * wallet) in key order, after the rollup shards (D559): the customer leaderboard reads these, not the clears.
 */
const WALLET_HOURS = `, spent AS (
          INSERT INTO market_wallet_hours AS w (hour_ms, wallet, spend, requests)
          SELECT at_ms - at_ms % 3600000, wallet, sum(charged), count(*)
          FROM cleared
          GROUP BY 1, 2
          ORDER BY 1, 2
          ON CONFLICT (hour_ms, wallet) DO UPDATE
          SET spend = w.spend + EXCLUDED.spend, requests = w.requests + EXCLUDED.requests
        )`

// What `market_clear_record` (0011) did for each economics row at commit, for a set of settled receipts at
// once: each captured request's clear (its receipt and its economics, both written by the same settling
// statement), the rollup shards summed over the clears and upserted once each in their key's order, and one
// notification per clear in id order. A receipt released, or economics reaped, clear nothing. Written once
// for the two places that run it: the trigger, over the statement's new receipts, and the function that
// clears named requests one by one when the statement's clears together fail.
const clearsOf = (receipts: string, walletHours: boolean) => `
        WITH settled AS (
          SELECT n.request_id, n.body AS r, e.body AS e,
                 ((n.body->>'in_tokens')::bigint - (n.body->>'cached_tokens')::bigint) * (n.body->>'price_in')::bigint
                 + (n.body->>'cached_tokens')::bigint
                   * COALESCE((n.body->>'price_in_cached')::bigint, (n.body->>'price_in')::bigint)
                 + (n.body->>'out_tokens')::bigint * (n.body->>'price_out')::bigint AS num
          FROM ${receipts} n JOIN economics e ON e.request_id = n.request_id
          WHERE n.body->>'status' IS DISTINCT FROM 'released' AND NOT (e.body ? 'reaped')
        ), cleared AS (
          INSERT INTO market_clears (request_id, at_ms, model_class, provider_id, wallet, profile, price_in,
                                     price_out, price_in_cached, tokens_in, tokens_out, tokens_cached, charge_num,
                                     charged, ttft_ms, price_setter, quotes_competing)
          SELECT request_id, (r->>'created_at')::bigint, r->>'model_class', r->>'provider_id', lower(r->>'wallet'),
                 e->>'profile', (r->>'price_in')::bigint, (r->>'price_out')::bigint,
                 (r->>'price_in_cached')::bigint, (r->>'in_tokens')::bigint, (r->>'out_tokens')::bigint,
                 (r->>'cached_tokens')::bigint, num, (r->>'charged')::bigint, (r->>'ttft_ms')::integer,
                 e->>'price_setter', (e->>'quotes_competing')::integer
          FROM settled
          ON CONFLICT (request_id) DO NOTHING
          RETURNING *
        ), rolled AS (
          INSERT INTO market_rollups AS m (hour_ms, model_class, provider_id, shard, clears, tokens, charge_num,
                                           volume, high, low, ttft_sum)
          SELECT at_ms - at_ms % 3600000, model_class, provider_id, hashtext(request_id) & 7, count(*),
                 sum(tokens_in + tokens_out), sum(charge_num), sum(charged),
                 max(CASE WHEN tokens_in + tokens_out > 0 THEN round(charge_num::numeric / (tokens_in + tokens_out))
                          ELSE 0 END),
                 min(CASE WHEN tokens_in + tokens_out > 0 THEN round(charge_num::numeric / (tokens_in + tokens_out))
                          ELSE 9223372036854775807 END),
                 sum(ttft_ms)
          FROM cleared
          GROUP BY 1, 2, 3, 4
          ORDER BY 1, 2, 3, 4
          ON CONFLICT (hour_ms, model_class, provider_id, shard) DO UPDATE
          SET clears = m.clears + EXCLUDED.clears,
              tokens = m.tokens + EXCLUDED.tokens,
              charge_num = m.charge_num + EXCLUDED.charge_num,
              volume = m.volume + EXCLUDED.volume,
              high = GREATEST(m.high, EXCLUDED.high),
              low = LEAST(m.low, EXCLUDED.low),
              ttft_sum = m.ttft_sum + EXCLUDED.ttft_sum
        )${walletHours ? WALLET_HOURS : ""}
        SELECT count(*) INTO notified
        FROM (SELECT pg_notify('market_clears', row_to_json(c)::text) FROM (SELECT * FROM cleared ORDER BY id) c) n;`

/**
 * The two functions that write a settling statement's clears: the trigger's, over the statement's new receipts,
 * and the one that clears a named request alone when the statement's clears together fail.
 */
export const clearFunctions = (walletHours: boolean) => [
  `
      CREATE OR REPLACE FUNCTION market_clear_request(p_request TEXT) RETURNS void
      LANGUAGE plpgsql AS $$
      DECLARE
        notified BIGINT;
      BEGIN
        ${clearsOf("(SELECT * FROM receipts WHERE request_id = p_request)", walletHours)}
      END
      $$
    `,
  // A statement's receipts clear together in one subtransaction; should that fail, each clears alone in its own,
  // as the deferred trigger cleared them: market data never costs a settlement its capture, and a clear that
  // cannot be written is skipped, loudly, without the others.
  `
      CREATE OR REPLACE FUNCTION market_clears_of_receipts() RETURNS trigger
      LANGUAGE plpgsql AS $$
      DECLARE
        notified BIGINT;
        one TEXT;
      BEGIN
        -- A statement that inserted no receipt (a settlement already made) has nothing to clear.
        IF NOT EXISTS (SELECT 1 FROM inserted_receipts) THEN
          RETURN NULL;
        END IF;
        BEGIN
          ${clearsOf("inserted_receipts", walletHours)}
        EXCEPTION WHEN OTHERS THEN
          FOR one IN SELECT request_id FROM inserted_receipts ORDER BY request_id LOOP
            BEGIN
              PERFORM market_clear_request(one);
            EXCEPTION WHEN OTHERS THEN
              RAISE WARNING 'market_clear_record skipped %: %', one, SQLERRM;
            END;
          END LOOP;
        END;
        RETURN NULL;
      END
      $$
    `
]

/**
 * A statement that settles requests writes their market clears, rollups and notifications once, at the end of
 * the statement, instead of a deferred trigger per economics row at commit (issue 12, docs/decisions.md D547).
 */
export const statementClears: Migrations = {
  "0041_statement_clears": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    for (const created of clearFunctions(false)) yield* sql.unsafe(created)
    // Triggers of one event on one table fire in the order of their names: this one after
    // `receipts_points_inserted` (0040), so a settling statement locks its points rows, then the rollup shards,
    // the order the deferred trigger took them in at commit.
    yield* sql`
      CREATE TRIGGER receipts_to_market AFTER INSERT ON receipts
      REFERENCING NEW TABLE AS inserted_receipts
      FOR EACH STATEMENT EXECUTE FUNCTION market_clears_of_receipts()
    `
    yield* sql`DROP TRIGGER economics_market_clear ON economics`
    yield* sql`DROP FUNCTION market_clear_record()`
  })
}
