import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/** The paid path: reconciliation runs, the market, payments and receipts, epochs, keys and credits, sessions, capacity leases and provider payouts. */
export const paidPath: Migrations = {
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
  }),
  "0003_payments_receipts": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One row per paid request: what was reserved and what was captured. No prompt, no reply.
    yield* sql`
      CREATE TABLE requests (
        request_id TEXT PRIMARY KEY,
        dialect TEXT NOT NULL,
        payment_kind TEXT NOT NULL CHECK (payment_kind IN ('x402', 'credit')),
        payer TEXT NOT NULL,
        requested_model TEXT NOT NULL,
        model_class TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        authorized BIGINT NOT NULL CHECK (authorized >= 0),
        charged BIGINT CHECK (charged >= 0 AND charged <= authorized),
        status TEXT NOT NULL CHECK (status IN ('reserved', 'captured', 'released')),
        agent JSONB NOT NULL DEFAULT '{}'::jsonb,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at TIMESTAMPTZ
      )
    `
    // EIP-3009 authorizations awaiting or done settlement. The signature is kept only until the
    // transfer lands (then erased): settlement must survive a restart, the envelope never is stored.
    yield* sql`
      CREATE TABLE x402_authorizations (
        payer TEXT NOT NULL,
        nonce TEXT NOT NULL,
        request_id TEXT NOT NULL UNIQUE REFERENCES requests (request_id),
        value BIGINT NOT NULL CHECK (value > 0),
        valid_after BIGINT NOT NULL,
        valid_before BIGINT NOT NULL,
        signature TEXT,
        status TEXT NOT NULL CHECK (status IN ('reserved', 'pending', 'submitted', 'landed', 'failed', 'released')),
        tx_hash TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (payer, nonce)
      )
    `
    // Append-only: every movement of money, written in the same transaction as what it changes.
    yield* sql`
      CREATE TABLE ledger_entries (
        id BIGSERIAL PRIMARY KEY,
        request_id TEXT,
        account TEXT NOT NULL,
        kind TEXT NOT NULL,
        amount BIGINT NOT NULL CHECK (amount >= 0),
        ref TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    yield* sql`CREATE INDEX ledger_entries_request ON ledger_entries (request_id)`
    yield* sql`
      CREATE TABLE wallet_balances (
        wallet TEXT PRIMARY KEY,
        available BIGINT NOT NULL DEFAULT 0 CHECK (available >= 0),
        reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    yield* sql`
      CREATE TABLE refunds (
        request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
        payer TEXT NOT NULL,
        amount BIGINT NOT NULL CHECK (amount > 0),
        epoch_id BIGINT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('due', 'paying', 'paid', 'credited')),
        tx_hash TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        settled_at TIMESTAMPTZ
      )
    `
    yield* sql`CREATE INDEX refunds_due ON refunds (status, epoch_id)`
    yield* sql`
      CREATE TABLE receipts (
        request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
        epoch_id BIGINT NOT NULL,
        body JSONB NOT NULL,
        signature TEXT,
        final BOOLEAN NOT NULL DEFAULT false,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    yield* sql`CREATE INDEX receipts_epoch ON receipts (epoch_id)`
    yield* sql`
      CREATE TABLE economics (
        request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
        body JSONB NOT NULL
      )
    `
    yield* sql`
      CREATE TABLE idempotency_keys (
        key TEXT PRIMARY KEY,
        body_hash TEXT NOT NULL,
        request_id TEXT,
        state TEXT NOT NULL CHECK (state IN ('in_progress', 'done', 'failed')),
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    yield* sql`
      CREATE TABLE epochs (
        epoch_id BIGINT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('closing', 'closed')),
        root TEXT,
        anchor_tx TEXT,
        receipts INTEGER,
        closed_at TIMESTAMPTZ
      )
    `
  }),
  "0004_epochs_reconciliation": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // The leaf each receipt had when its epoch closed, and its position in the epoch's tree.
    yield* sql`ALTER TABLE receipts ADD COLUMN leaf TEXT, ADD COLUMN leaf_index INTEGER`
    yield* sql`CREATE INDEX receipts_epoch_leaf ON receipts (epoch_id, leaf_index)`
    // An epoch closes only when no request reserved before its end is still in flight.
    yield* sql`CREATE INDEX requests_in_flight ON requests (created_at) WHERE status = 'reserved'`
    // The chain height when the close was recorded: where to look for an anchor sent before a crash.
    yield* sql`ALTER TABLE epochs ADD COLUMN from_block BIGINT, ADD COLUMN closing_at TIMESTAMPTZ DEFAULT now()`
  }),
  "0005_keys_credits": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      CREATE TABLE wallets (
        wallet TEXT PRIMARY KEY,
        invited BOOLEAN NOT NULL DEFAULT false,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    // A key is a record; its secret is returned once and only its SHA-256 is kept.
    yield* sql`
      CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY,
        wallet TEXT NOT NULL,
        label TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('credit', 'api')),
        key_hash TEXT NOT NULL UNIQUE,
        budget BIGINT NOT NULL CHECK (budget >= 0),
        spent BIGINT NOT NULL DEFAULT 0 CHECK (spent >= 0),
        reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
        requests BIGINT NOT NULL DEFAULT 0,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        revoked_at TIMESTAMPTZ,
        CONSTRAINT api_keys_within_budget CHECK (spent + reserved <= budget)
      )
    `
    yield* sql`CREATE INDEX api_keys_wallet ON api_keys (wallet)`
    // Replay guard of wallet-signed key requests: a signed message is accepted once.
    yield* sql`
      CREATE TABLE keys_signatures (
        sig_hash TEXT PRIMARY KEY,
        wallet TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
      )
    `
    yield* sql`CREATE INDEX keys_signatures_expiry ON keys_signatures (expires_at)`
    yield* sql`
      CREATE TABLE deposits (
        deposit_id TEXT PRIMARY KEY,
        wallet TEXT NOT NULL,
        amount BIGINT NOT NULL CHECK (amount > 0),
        request_id TEXT UNIQUE,
        status TEXT NOT NULL CHECK (status IN ('pending', 'credited', 'failed')),
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        credited_at TIMESTAMPTZ
      )
    `
    yield* sql`CREATE INDEX deposits_wallet_pending ON deposits (wallet) WHERE status = 'pending'`
    // Payout queue columns: a claim pushes next_attempt_at ahead (a lease shared by all instances).
    yield* sql`
      CREATE TABLE withdrawals (
        withdrawal_id TEXT PRIMARY KEY,
        wallet TEXT NOT NULL,
        amount BIGINT NOT NULL CHECK (amount > 0),
        to_address TEXT NOT NULL,
        nonce TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'failed')),
        tx_hash TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        last_error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        paid_at TIMESTAMPTZ
      )
    `
    yield* sql`CREATE INDEX withdrawals_queue ON withdrawals (next_attempt_at) WHERE status = 'pending'`
  }),
  "0006_credit_requests_sessions": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`ALTER TABLE requests ADD COLUMN key_id TEXT`
    yield* sql`ALTER TABLE requests ADD COLUMN session_id TEXT`
    // A session turn draws on its session's budget: no authorization, no key reservation of its own.
    yield* sql`ALTER TABLE requests DROP CONSTRAINT requests_payment_kind_check`
    yield* sql`ALTER TABLE requests ADD CONSTRAINT requests_payment_kind_check
               CHECK (payment_kind IN ('x402', 'credit', 'session'))`
    yield* sql`CREATE INDEX requests_key ON requests (key_id, created_at)`
    // A budget session: funded once by its opening call, drawn on by later turns without a new
    // signature. `in_flight` makes a session serve one request at a time (409 session_used).
    yield* sql`
      CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL,
        payer TEXT NOT NULL,
        funding_kind TEXT NOT NULL CHECK (funding_kind IN ('x402', 'credit')),
        funding_request_id TEXT NOT NULL,
        key_id TEXT,
        budget BIGINT NOT NULL CHECK (budget >= 0),
        spent BIGINT NOT NULL DEFAULT 0 CHECK (spent >= 0),
        provider_id TEXT NOT NULL,
        model_class TEXT NOT NULL,
        price_in BIGINT NOT NULL,
        price_out BIGINT NOT NULL,
        price_in_cached BIGINT,
        expires_at TIMESTAMPTZ NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('open', 'closed', 'dead')),
        in_flight TEXT,
        turns INTEGER NOT NULL DEFAULT 0,
        prefix_tokens INTEGER NOT NULL DEFAULT 0,
        refund_ref TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        closed_at TIMESTAMPTZ,
        CHECK (spent <= budget)
      )
    `
  }),
  "0007_capacity_function": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One round trip on the first-byte path. A VOLATILE plpgsql function takes a fresh snapshot
    // per statement (READ COMMITTED), so the count below sees every lease committed before the
    // advisory lock was granted: the signed ceiling holds across any number of instances.
    yield* sql`
      CREATE FUNCTION acquire_capacity(p_provider TEXT, p_class TEXT, p_capacity INTEGER, p_lease TEXT,
                                       p_ttl INTERVAL) RETURNS BOOLEAN
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        in_use INTEGER;
      BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_provider || '|' || p_class, 7402));
        SELECT count(*) INTO in_use FROM capacity_leases
        WHERE provider_id = p_provider AND model_class = p_class AND expires_at > now();
        IF in_use >= p_capacity THEN
          RETURN false;
        END IF;
        INSERT INTO capacity_leases (lease_id, provider_id, model_class, expires_at)
        VALUES (p_lease, p_provider, p_class, now() + p_ttl);
        RETURN true;
      END
      $$
    `
  }),
  "0008_provider_payouts": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One transfer per provider at an epoch close: the sum of the shares it pays, to the registered signer.
    yield* sql`
      CREATE TABLE provider_payouts (
        payout_id TEXT PRIMARY KEY,
        provider_id TEXT NOT NULL,
        to_address TEXT NOT NULL,
        amount BIGINT NOT NULL CHECK (amount > 0),
        status TEXT NOT NULL CHECK (status IN ('paying', 'paid', 'failed')),
        tx_hash TEXT,
        epoch_id BIGINT NOT NULL,
        from_block BIGINT NOT NULL,
        last_error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        paid_at TIMESTAMPTZ
      )
    `
    yield* sql`CREATE INDEX provider_payouts_paying ON provider_payouts (provider_id) WHERE status = 'paying'`
    // The payout that pays a request's provider share; a share is claimed once (NULL: still accruing).
    yield* sql`ALTER TABLE requests ADD COLUMN payout_id TEXT REFERENCES provider_payouts (payout_id)`
    yield* sql`CREATE INDEX requests_payout ON requests (payout_id) WHERE payout_id IS NOT NULL`
    yield* sql`
      CREATE INDEX requests_share_unpaid ON requests (provider_id)
      WHERE status = 'captured' AND payout_id IS NULL AND dialect <> 'deposit'
    `
  })
}
