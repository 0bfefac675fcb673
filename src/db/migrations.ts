import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Numbered, append-only migrations. Each runs once (the migrator records it in
 * `effect_sql_migrations`); a new schema change is a new entry, never an edit.
 */
export const migrations: Record<string, Effect.Effect<void, unknown, SqlClient.SqlClient>> = {
  "0001_reconciliation_runs": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      CREATE TABLE reconciliation_runs (
        id BIGSERIAL PRIMARY KEY,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at TIMESTAMPTZ,
        status TEXT NOT NULL CHECK (status IN ('running', 'ok', 'failed')),
        discrepancies JSONB NOT NULL DEFAULT '[]'::jsonb
      )
    `
  }),
  "0002_market": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      CREATE TABLE providers (
        provider_id TEXT PRIMARY KEY,
        signer TEXT NOT NULL,
        base_url TEXT NOT NULL,
        dialect TEXT NOT NULL CHECK (dialect IN ('openai', 'anthropic')),
        enabled BOOLEAN NOT NULL DEFAULT true,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    // Every verified quote, kept for audit; instances share the live book through it.
    yield* sql`
      CREATE TABLE quotes (
        quote_id TEXT PRIMARY KEY,
        provider_id TEXT NOT NULL REFERENCES providers (provider_id),
        model_class TEXT NOT NULL,
        price_in BIGINT NOT NULL CHECK (price_in >= 0),
        price_out BIGINT NOT NULL CHECK (price_out >= 0),
        max_context INTEGER NOT NULL,
        valid_until BIGINT NOT NULL,
        capacity_rps INTEGER NOT NULL,
        body JSONB NOT NULL,
        seq BIGSERIAL NOT NULL UNIQUE,
        received_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    yield* sql`CREATE INDEX quotes_live ON quotes (valid_until)`
    // Concurrency slots on a provider's standing quote for one class: a row per request
    // in flight, expiring so a crashed instance cannot hold capacity forever.
    yield* sql`
      CREATE TABLE capacity_leases (
        lease_id TEXT PRIMARY KEY,
        provider_id TEXT NOT NULL,
        model_class TEXT NOT NULL,
        acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        expires_at TIMESTAMPTZ NOT NULL
      )
    `
    yield* sql`CREATE INDEX capacity_leases_slot ON capacity_leases (provider_id, model_class, expires_at)`
    yield* sql`
      CREATE TABLE capacity_gates (
        provider_id TEXT NOT NULL,
        model_class TEXT NOT NULL,
        PRIMARY KEY (provider_id, model_class)
      )
    `
  })
}
