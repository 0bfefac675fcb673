import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/** Public market data: clearing records, rollups and routing feedback. */
export const marketData: Migrations = {
  "0011_market_data": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // The compact clearing record of every served request (docs/decisions.md D120): derived from the
    // receipt and economics the paid path already writes, by the trigger below, in their transaction.
    // Rebuildable from those two records; it holds no prompt, no reply and nothing of a payment.
    yield* sql`
      CREATE TABLE market_clears (
        id BIGSERIAL PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE REFERENCES requests (request_id),
        at_ms BIGINT NOT NULL,
        model_class TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        wallet TEXT NOT NULL,
        profile TEXT NOT NULL,
        price_in BIGINT NOT NULL,
        price_out BIGINT NOT NULL,
        price_in_cached BIGINT,
        tokens_in BIGINT NOT NULL,
        tokens_out BIGINT NOT NULL,
        tokens_cached BIGINT NOT NULL,
        charge_num BIGINT NOT NULL,
        charged BIGINT NOT NULL,
        ttft_ms INTEGER NOT NULL,
        price_setter TEXT NOT NULL,
        quotes_competing INTEGER NOT NULL
      )
    `
    yield* sql`CREATE INDEX market_clears_at ON market_clears (at_ms)`
    yield* sql`CREATE INDEX market_clears_provider ON market_clears (provider_id, at_ms)`
    // Hourly aggregates per (class, provider), kept 90 days (D124). Spread over 8 shards by request id,
    // as the points of a provider are, so concurrent captures do not queue on one row; a read sums them.
    yield* sql`
      CREATE TABLE market_rollups (
        hour_ms BIGINT NOT NULL,
        model_class TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        shard SMALLINT NOT NULL,
        clears BIGINT NOT NULL,
        tokens BIGINT NOT NULL,
        charge_num NUMERIC NOT NULL,
        volume BIGINT NOT NULL,
        high BIGINT NOT NULL,
        low BIGINT NOT NULL,
        ttft_sum BIGINT NOT NULL,
        PRIMARY KEY (hour_ms, model_class, provider_id, shard)
      )
    `
    // At commit (deferred), when both records of a request are there: a released request cleared
    // nothing and a reaped one has no auction, so neither leaves a clear. Listeners learn of each
    // clear (its row, as JSON) when the transaction commits.
    yield* sql`
      CREATE FUNCTION market_clear_record() RETURNS trigger
      LANGUAGE plpgsql AS $$
      DECLARE
        r JSONB; e JSONB := NEW.body; c market_clears%ROWTYPE; num BIGINT; tokens BIGINT;
      BEGIN
        IF e ? 'reaped' THEN RETURN NULL; END IF;
        SELECT body INTO r FROM receipts WHERE request_id = NEW.request_id;
        IF r IS NULL OR r->>'status' = 'released' THEN RETURN NULL; END IF;
        num := ((r->>'in_tokens')::bigint - (r->>'cached_tokens')::bigint) * (r->>'price_in')::bigint
             + (r->>'cached_tokens')::bigint * COALESCE((r->>'price_in_cached')::bigint, (r->>'price_in')::bigint)
             + (r->>'out_tokens')::bigint * (r->>'price_out')::bigint;
        INSERT INTO market_clears (request_id, at_ms, model_class, provider_id, wallet, profile, price_in,
                                   price_out, price_in_cached, tokens_in, tokens_out, tokens_cached, charge_num,
                                   charged, ttft_ms, price_setter, quotes_competing)
        VALUES (NEW.request_id, (r->>'created_at')::bigint, r->>'model_class', r->>'provider_id',
                lower(r->>'wallet'), e->>'profile', (r->>'price_in')::bigint, (r->>'price_out')::bigint,
                (r->>'price_in_cached')::bigint, (r->>'in_tokens')::bigint, (r->>'out_tokens')::bigint,
                (r->>'cached_tokens')::bigint, num, (r->>'charged')::bigint, (r->>'ttft_ms')::integer,
                e->>'price_setter', (e->>'quotes_competing')::integer)
        ON CONFLICT (request_id) DO NOTHING
        RETURNING * INTO c;
        IF c.id IS NULL THEN RETURN NULL; END IF;
        tokens := c.tokens_in + c.tokens_out;
        INSERT INTO market_rollups (hour_ms, model_class, provider_id, shard, clears, tokens, charge_num, volume,
                                    high, low, ttft_sum)
        VALUES (c.at_ms - c.at_ms % 3600000, c.model_class, c.provider_id, hashtext(c.request_id) & 7, 1, tokens,
                num, c.charged,
                CASE WHEN tokens > 0 THEN round(num::numeric / tokens) ELSE 0 END,
                CASE WHEN tokens > 0 THEN round(num::numeric / tokens) ELSE 9223372036854775807 END,
                c.ttft_ms)
        ON CONFLICT (hour_ms, model_class, provider_id, shard) DO UPDATE
        SET clears = market_rollups.clears + 1,
            tokens = market_rollups.tokens + EXCLUDED.tokens,
            charge_num = market_rollups.charge_num + EXCLUDED.charge_num,
            volume = market_rollups.volume + EXCLUDED.volume,
            high = GREATEST(market_rollups.high, EXCLUDED.high),
            low = LEAST(market_rollups.low, EXCLUDED.low),
            ttft_sum = market_rollups.ttft_sum + EXCLUDED.ttft_sum;
        PERFORM pg_notify('market_clears', row_to_json(c)::text);
        RETURN NULL;
      EXCEPTION WHEN OTHERS THEN
        -- Market data never costs a paid request its capture: a record it cannot read is skipped, loudly.
        RAISE WARNING 'market_clear_record skipped %: %', NEW.request_id, SQLERRM;
        RETURN NULL;
      END
      $$
    `
    yield* sql`
      CREATE CONSTRAINT TRIGGER economics_market_clear AFTER INSERT ON economics
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION market_clear_record()
    `
  }),
  "0019_market_feedback": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One explicit rating per served request (D129): who rated is not kept, only the request it rates.
    yield* sql`
      CREATE TABLE market_feedback (
        request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
        model_class TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        task TEXT NOT NULL,
        rating SMALLINT NOT NULL CHECK (rating BETWEEN 1 AND 5),
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    yield* sql`CREATE INDEX market_feedback_fit ON market_feedback (model_class, task)`
  })
}
