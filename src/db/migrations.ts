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
  }),
  "0009_integrity_points": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // Points per wallet, derived from receipts (by the trigger below) and from the programs'
    // records (rewards, challenges: by their own transactions). Charged sums stay in base units so
    // the points of a sum are rounded once; `score` is what the leaderboard index orders.
    yield* sql`
      CREATE TABLE points_wallets (
        wallet TEXT PRIMARY KEY,
        settled_charged BIGINT NOT NULL DEFAULT 0,
        pending_charged BIGINT NOT NULL DEFAULT 0,
        rewards BIGINT NOT NULL DEFAULT 0,
        bounties BIGINT NOT NULL DEFAULT 0,
        forfeited BIGINT NOT NULL DEFAULT 0,
        locked BIGINT NOT NULL DEFAULT 0 CHECK (locked >= 0),
        open_challenges INTEGER NOT NULL DEFAULT 0,
        won INTEGER NOT NULL DEFAULT 0,
        lost INTEGER NOT NULL DEFAULT 0,
        ambiguous INTEGER NOT NULL DEFAULT 0,
        score BIGINT GENERATED ALWAYS AS (settled_charged / 10000 + rewards + bounties - forfeited) STORED
      )
    `
    yield* sql`CREATE INDEX points_wallets_rank ON points_wallets (score DESC, wallet)`
    // Per provider, spread over 8 rows (by request id) so concurrent captures for one provider do
    // not queue on one row; a read sums at most 8.
    yield* sql`
      CREATE TABLE points_providers (
        provider_id TEXT NOT NULL,
        shard SMALLINT NOT NULL,
        settled_charged BIGINT NOT NULL DEFAULT 0,
        pending_charged BIGINT NOT NULL DEFAULT 0,
        receipts BIGINT NOT NULL DEFAULT 0,
        receipts_ok BIGINT NOT NULL DEFAULT 0,
        slashed BIGINT NOT NULL DEFAULT 0,
        upheld INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (provider_id, shard)
      )
    `
    // One receipt's change to the points of its wallet and provider; zero deltas write nothing.
    yield* sql`
      CREATE FUNCTION points_apply_receipt(p_wallet TEXT, p_provider TEXT, p_request TEXT, d_settled BIGINT,
                                           d_pending BIGINT, d_receipts INTEGER, d_ok INTEGER) RETURNS void
      LANGUAGE plpgsql AS $$
      BEGIN
        IF d_settled <> 0 OR d_pending <> 0 THEN
          INSERT INTO points_wallets (wallet, settled_charged, pending_charged) VALUES (p_wallet, d_settled, d_pending)
          ON CONFLICT (wallet) DO UPDATE
          SET settled_charged = points_wallets.settled_charged + EXCLUDED.settled_charged,
              pending_charged = points_wallets.pending_charged + EXCLUDED.pending_charged;
        END IF;
        IF d_settled <> 0 OR d_pending <> 0 OR d_receipts <> 0 OR d_ok <> 0 THEN
          INSERT INTO points_providers (provider_id, shard, settled_charged, pending_charged, receipts, receipts_ok)
          VALUES (p_provider, hashtext(p_request) & 7, d_settled, d_pending, d_receipts, d_ok)
          ON CONFLICT (provider_id, shard) DO UPDATE
          SET settled_charged = points_providers.settled_charged + EXCLUDED.settled_charged,
              pending_charged = points_providers.pending_charged + EXCLUDED.pending_charged,
              receipts = points_providers.receipts + EXCLUDED.receipts,
              receipts_ok = points_providers.receipts_ok + EXCLUDED.receipts_ok;
        END IF;
      END
      $$
    `
    // The one hook on the paid path: whatever writes a receipt (capture, release, settlement,
    // epoch repair) moves its points in the same transaction. A receipt earns while its settlement
    // is `pending` (pending) or `landed` (settled); `none` and `failed` earn nothing.
    yield* sql`
      CREATE FUNCTION points_receipt_changed() RETURNS trigger
      LANGUAGE plpgsql AS $$
      DECLARE
        o_settled BIGINT := 0; o_pending BIGINT := 0; o_n INTEGER := 0; o_ok INTEGER := 0;
        n_settled BIGINT := 0; n_pending BIGINT := 0; n_n INTEGER := 0; n_ok INTEGER := 0;
      BEGIN
        IF TG_OP <> 'INSERT' THEN
          o_n := 1;
          o_ok := CASE WHEN OLD.body->>'status' = 'ok' THEN 1 ELSE 0 END;
          o_settled := CASE WHEN OLD.body->>'settlement' = 'landed' THEN (OLD.body->>'charged')::bigint ELSE 0 END;
          o_pending := CASE WHEN OLD.body->>'settlement' = 'pending' THEN (OLD.body->>'charged')::bigint ELSE 0 END;
        END IF;
        IF TG_OP <> 'DELETE' THEN
          n_n := 1;
          n_ok := CASE WHEN NEW.body->>'status' = 'ok' THEN 1 ELSE 0 END;
          n_settled := CASE WHEN NEW.body->>'settlement' = 'landed' THEN (NEW.body->>'charged')::bigint ELSE 0 END;
          n_pending := CASE WHEN NEW.body->>'settlement' = 'pending' THEN (NEW.body->>'charged')::bigint ELSE 0 END;
        END IF;
        IF TG_OP = 'UPDATE' AND lower(OLD.body->>'wallet') = lower(NEW.body->>'wallet')
           AND OLD.body->>'provider_id' = NEW.body->>'provider_id' THEN
          PERFORM points_apply_receipt(lower(NEW.body->>'wallet'), NEW.body->>'provider_id', NEW.request_id,
                                       n_settled - o_settled, n_pending - o_pending, n_n - o_n, n_ok - o_ok);
          RETURN NULL;
        END IF;
        IF TG_OP <> 'INSERT' THEN
          PERFORM points_apply_receipt(lower(OLD.body->>'wallet'), OLD.body->>'provider_id', OLD.request_id,
                                       -o_settled, -o_pending, -o_n, -o_ok);
        END IF;
        IF TG_OP <> 'DELETE' THEN
          PERFORM points_apply_receipt(lower(NEW.body->>'wallet'), NEW.body->>'provider_id', NEW.request_id,
                                       n_settled, n_pending, n_n, n_ok);
        END IF;
        RETURN NULL;
      END
      $$
    `
    yield* sql`
      CREATE TRIGGER receipts_points AFTER INSERT OR DELETE OR UPDATE OF body ON receipts
      FOR EACH ROW EXECUTE FUNCTION points_receipt_changed()
    `
    // One-time rewards: the primary key pays each reward once per wallet, however often it is sent.
    yield* sql`
      CREATE TABLE points_rewards (
        wallet TEXT NOT NULL,
        reward TEXT NOT NULL CHECK (reward IN ('follow', 'demo_share')),
        points BIGINT NOT NULL CHECK (points > 0),
        intent_digest TEXT NOT NULL UNIQUE,
        issued_at BIGINT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (wallet, reward)
      )
    `
    // A provider's signed declaration of the model it serves for a class; one active per class.
    yield* sql`
      CREATE TABLE integrity_claims (
        claim_id TEXT PRIMARY KEY,
        provider_id TEXT NOT NULL REFERENCES providers (provider_id),
        model_class TEXT NOT NULL,
        model TEXT NOT NULL,
        bond_amount BIGINT NOT NULL CHECK (bond_amount >= 0),
        signed_at BIGINT NOT NULL,
        signer TEXT NOT NULL,
        signature TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('active', 'superseded')),
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        superseded_at TIMESTAMPTZ
      )
    `
    yield* sql`
      CREATE UNIQUE INDEX integrity_claims_active ON integrity_claims (provider_id, model_class)
      WHERE status = 'active'
    `
    yield* sql`
      CREATE TABLE integrity_challengers (
        wallet TEXT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('approved', 'revoked')),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    // `evidence` is the canonical JSON the challenger hashed (their own submission, bounded in size).
    yield* sql`
      CREATE TABLE integrity_challenges (
        challenge_id TEXT PRIMARY KEY,
        receipt_id TEXT NOT NULL REFERENCES receipts (request_id),
        wallet TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        model_class TEXT NOT NULL,
        claim_id TEXT REFERENCES integrity_claims (claim_id),
        evidence_hash TEXT NOT NULL,
        evidence TEXT NOT NULL,
        filing_digest TEXT NOT NULL UNIQUE,
        signature TEXT NOT NULL,
        stake BIGINT NOT NULL CHECK (stake > 0),
        status TEXT NOT NULL CHECK (status IN ('open', 'upheld', 'rejected', 'ambiguous')),
        slash BIGINT,
        bounty BIGINT,
        note TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        decided_at TIMESTAMPTZ
      )
    `
    // Spec 7 and 8: one live challenge per receipt; an open or upheld one blocks every other filing.
    yield* sql`
      CREATE UNIQUE INDEX integrity_challenges_live ON integrity_challenges (receipt_id)
      WHERE status IN ('open', 'upheld')
    `
    yield* sql`CREATE INDEX integrity_challenges_status ON integrity_challenges (status, created_at)`
  }),
  "0010_agent_setups": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // A key may carry an expiry (NULL: never); the spending path refuses it past that time.
    yield* sql`ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMPTZ`
    // Device-flow setups (spec 4.5): the codes are stored only as SHA-256. `setup_id` is the random
    // nonce the approving wallet signs; expiry is a time, never a status, so no sweep is needed to apply it.
    yield* sql`
      CREATE TABLE agent_setups (
        setup_id TEXT PRIMARY KEY,
        device_code_hash TEXT NOT NULL UNIQUE,
        user_code_hash TEXT NOT NULL,
        harness TEXT NOT NULL,
        network TEXT NOT NULL,
        label TEXT NOT NULL,
        budget BIGINT NOT NULL CHECK (budget > 0),
        key_expires_at TIMESTAMPTZ NOT NULL,
        wallet TEXT,
        status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'exchanged')),
        interval_s INTEGER NOT NULL CHECK (interval_s > 0),
        created_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        last_polled_at TIMESTAMPTZ,
        approved_by TEXT,
        approved_budget BIGINT CHECK (approved_budget > 0 AND approved_budget <= budget),
        approval_signature TEXT,
        decided_at TIMESTAMPTZ,
        key_id TEXT REFERENCES api_keys (key_id),
        exchanged_at TIMESTAMPTZ
      )
    `
    // A user code names one undecided setup at a time; finished setups free their code.
    yield* sql`
      CREATE UNIQUE INDEX agent_setups_live_user_code ON agent_setups (user_code_hash)
      WHERE status IN ('pending', 'approved')
    `
    yield* sql`CREATE INDEX agent_setups_expiry ON agent_setups (expires_at) WHERE status <> 'exchanged'`
  }),
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
  "0012_tasks": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // Durable tasks (spec 4.3, D135-D141). The capability token is stored only as SHA-256. The budget
    // columns are moved only by payment/TaskBudgets.ts: `held` is the worst case of the task's paid calls
    // in flight, `spent` the sum of their receipts' charges; the CHECKs make overspending impossible
    // whatever the interleaving. `fence` grows on every new claim; writes under an older fence are refused.
    yield* sql`
      CREATE TABLE tasks (
        task_id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        owner_key_id TEXT,
        goal TEXT NOT NULL,
        max_steps INTEGER NOT NULL CHECK (max_steps > 0),
        budget BIGINT NOT NULL CHECK (budget >= 0),
        retention_hours INTEGER NOT NULL CHECK (retention_hours BETWEEN 1 AND 720),
        state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
        steps INTEGER NOT NULL DEFAULT 0,
        spent BIGINT NOT NULL DEFAULT 0 CHECK (spent >= 0),
        held BIGINT NOT NULL DEFAULT 0 CHECK (held >= 0),
        last_seq BIGINT NOT NULL DEFAULT 0,
        fence BIGINT NOT NULL DEFAULT 0,
        lease_id TEXT,
        lease_worker TEXT,
        lease_expires_at BIGINT,
        acceptance JSONB,
        acceptance_frozen_at BIGINT,
        parent_task_id TEXT,
        parent_snapshot_id TEXT,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        CHECK (spent + held <= budget),
        CHECK (steps <= max_steps)
      )
    `
    yield* sql`CREATE INDEX tasks_expiry ON tasks (expires_at)`
    yield* sql`CREATE INDEX tasks_owner ON tasks (owner_key_id) WHERE owner_key_id IS NOT NULL`
    yield* sql`
      CREATE TABLE task_events (
        task_id TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        type TEXT NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('client', 'router')),
        data JSONB NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (task_id, seq)
      )
    `
    yield* sql`
      CREATE TABLE task_checkpoints (
        task_id TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
        checkpoint_no INTEGER NOT NULL,
        fence BIGINT NOT NULL,
        execution JSONB NOT NULL,
        context JSONB NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (task_id, checkpoint_no)
      )
    `
    yield* sql`
      CREATE TABLE task_effects (
        task_id TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
        effect_id TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('begun', 'completed', 'abandoned')),
        fence BIGINT NOT NULL,
        description JSONB NOT NULL,
        result JSONB,
        begun_at BIGINT NOT NULL,
        resolved_at BIGINT,
        PRIMARY KEY (task_id, effect_id)
      )
    `
    // The paid calls made for a task: held while in flight, charged from the receipt once settled.
    yield* sql`
      CREATE TABLE task_calls (
        request_id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL REFERENCES tasks (task_id) ON DELETE CASCADE,
        held BIGINT NOT NULL CHECK (held >= 0),
        charged BIGINT,
        created_at BIGINT NOT NULL,
        settled_at BIGINT
      )
    `
    yield* sql`CREATE INDEX task_calls_task ON task_calls (task_id, created_at)`
    yield* sql`CREATE INDEX task_calls_open ON task_calls (created_at) WHERE settled_at IS NULL`
  }),
  "0013_workspaces_evals": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // Content-addressed workspaces (D142): a file's bytes are stored once by SHA-256, whichever task
    // and snapshot name them; a snapshot is a manifest of paths to hashes.
    yield* sql`
      CREATE TABLE workspace_blobs (
        hash TEXT PRIMARY KEY,
        content BYTEA NOT NULL,
        size INTEGER NOT NULL
      )
    `
    yield* sql`
      CREATE TABLE workspace_snapshots (
        snapshot_id TEXT PRIMARY KEY,
        task_id TEXT,
        created_at BIGINT NOT NULL
      )
    `
    yield* sql`CREATE INDEX workspace_snapshots_task ON workspace_snapshots (task_id)`
    yield* sql`
      CREATE TABLE workspace_files (
        snapshot_id TEXT NOT NULL REFERENCES workspace_snapshots (snapshot_id) ON DELETE CASCADE,
        path TEXT NOT NULL,
        hash TEXT NOT NULL REFERENCES workspace_blobs (hash),
        PRIMARY KEY (snapshot_id, path)
      )
    `
    yield* sql`CREATE INDEX workspace_files_hash ON workspace_files (hash)`
    // Evaluation runs (D146-D148): wallet-owned, paid by the creating key, results per case.
    yield* sql`
      CREATE TABLE eval_runs (
        run_id TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        wallet TEXT NOT NULL,
        suite TEXT NOT NULL,
        target TEXT NOT NULL,
        budget BIGINT NOT NULL CHECK (budget > 0),
        spent BIGINT NOT NULL DEFAULT 0,
        status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
        created_at BIGINT NOT NULL,
        finished_at BIGINT
      )
    `
    yield* sql`CREATE INDEX eval_runs_key ON eval_runs (key_id, created_at)`
    yield* sql`
      CREATE TABLE eval_results (
        run_id TEXT NOT NULL REFERENCES eval_runs (run_id) ON DELETE CASCADE,
        case_id TEXT NOT NULL,
        dialect TEXT NOT NULL,
        passed BOOLEAN NOT NULL,
        outcome TEXT NOT NULL,
        request_id TEXT,
        charged BIGINT NOT NULL DEFAULT 0,
        latency_ms INTEGER NOT NULL,
        detail TEXT NOT NULL,
        PRIMARY KEY (run_id, case_id)
      )
    `
  }),
  "0014_router_instances": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One row per router process on this database, kept alive by its heartbeat (db/Instances.ts). A
    // connection names its instance in `application_name` ("svc-router/<id>"), so the capacity leases
    // and reservations it writes carry their instance without any statement saying so; a survivor
    // settles what a dead instance left open as soon as its heartbeat stops.
    yield* sql`
      CREATE TABLE router_instances (
        instance_id TEXT PRIMARY KEY,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        stopped_at TIMESTAMPTZ,
        settled_at TIMESTAMPTZ
      )
    `
    yield* sql`
      CREATE FUNCTION router_instance_of_connection() RETURNS TEXT LANGUAGE sql STABLE AS $$
        SELECT substring(current_setting('application_name') from '^svc-router/(.+)$')
      $$
    `
    yield* sql`ALTER TABLE capacity_leases ADD COLUMN instance_id TEXT DEFAULT router_instance_of_connection()`
    yield* sql`ALTER TABLE requests ADD COLUMN instance_id TEXT DEFAULT router_instance_of_connection()`
    yield* sql`CREATE INDEX capacity_leases_instance ON capacity_leases (instance_id)`
    yield* sql`CREATE INDEX requests_reserved_instance ON requests (instance_id) WHERE status = 'reserved'`
  }),
  "0015_outgoing_transactions": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // One row per account the router sends from: its row lock serializes nonce allocation across every
    // instance on this database; `next_nonce` is the lowest nonce no recorded transaction holds.
    yield* sql`
      CREATE TABLE treasury_senders (
        address TEXT PRIMARY KEY,
        next_nonce BIGINT NOT NULL CHECK (next_nonce >= 0),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
      )
    `
    // Every transaction the router signs, recorded (raw bytes, hash, nonce) in the transaction that takes
    // its nonce, before it is broadcast (ledger/Treasury.ts, docs/decisions.md D165-D170). `purpose` names
    // the one transfer it makes; `reverted` and `void` (its nonce was taken by another transaction) moved
    // nothing, so a later attempt for the same purpose may follow them; any other status is live.
    yield* sql`
      CREATE TABLE outgoing_transactions (
        id BIGSERIAL PRIMARY KEY,
        purpose TEXT NOT NULL,
        kind TEXT NOT NULL,
        sender TEXT NOT NULL REFERENCES treasury_senders (address),
        nonce BIGINT NOT NULL CHECK (nonce >= 0),
        tx_hash TEXT NOT NULL UNIQUE,
        raw_tx TEXT NOT NULL,
        to_address TEXT NOT NULL,
        call_data TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('signed', 'broadcast', 'mined', 'reverted', 'void')),
        block_number BIGINT,
        broadcasts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (sender, nonce)
      )
    `
    yield* sql`
      CREATE UNIQUE INDEX outgoing_transactions_live_purpose ON outgoing_transactions (purpose)
      WHERE status IN ('signed', 'broadcast', 'mined')
    `
    yield* sql`
      CREATE INDEX outgoing_transactions_open ON outgoing_transactions (sender, nonce)
      WHERE status IN ('signed', 'broadcast')
    `
  }),
  "0016_upto_authorizations": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // An x402 `upto` authorization (a Permit2 witness transfer) shares the queue of `exact` ones. Its `nonce`
    // is Permit2's, kept as `permit2:0x<32 bytes>` so it never meets a token's EIP-3009 nonce; `valid_after`
    // and `valid_before` are the witness's `validAfter` and the permit's `deadline`; `ceiling` is the signed
    // `permitted.amount`. `value` is what the settlement moves: the ceiling while reserved (all of it is
    // committed against the payer's balance), the metered charge from capture on (docs/decisions.md D201).
    yield* sql`
      ALTER TABLE x402_authorizations
        ADD COLUMN scheme TEXT NOT NULL DEFAULT 'exact' CHECK (scheme IN ('exact', 'upto')),
        ADD COLUMN ceiling BIGINT,
        ADD CONSTRAINT x402_authorizations_upto_ceiling
          CHECK ((scheme = 'exact' AND ceiling IS NULL) OR (scheme = 'upto' AND ceiling >= value))
    `
  }),
  // Receipts are signed just after they are stored (issue 12): the sweep finds the few an instance left
  // unsigned when it stopped, without reading the whole table.
  "0017_receipts_unsigned": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`CREATE INDEX receipts_unsigned ON receipts (created_at) WHERE signature IS NULL`
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
