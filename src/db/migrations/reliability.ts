import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/** Surviving crashes and paying exactly once: instance registry, outgoing transactions, upto authorizations, receipts signed after the reply. */
export const reliability: Migrations = {
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
  // Which instance claimed an x402 authorization for submission: when that instance is known dead its
  // claims go back to the queue at once (inference/Reaper.ts), not after the 3-minute recovery, so an epoch
  // is not held open by a settlement nobody is running (found by `npm run soak`).
  "0027_authorization_claims": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`ALTER TABLE x402_authorizations ADD COLUMN claimed_by TEXT`
    yield* sql`CREATE INDEX x402_authorizations_claimed ON x402_authorizations (claimed_by) WHERE status = 'submitted'`
  }),
  // What a request has delivered, while it is still `reserved` (ledger/Metered.ts, docs/decisions.md D211):
  // a checkpoint the serve step writes a second after the first token and then at most once a second, or
  // the final meter of a settlement that could not be written. Whoever settles the request later bills it.
  // Numbered above 0027: the migrator runs only ids above the latest applied one.
  "0029_metered_requests": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`ALTER TABLE requests ADD COLUMN IF NOT EXISTS metered JSONB`
  }),
  // Which instance holds an `Idempotency-Key` claim: an instance that dies holding one never runs the
  // claim's release, so the key would answer 409 "still in progress" to every retry for a day; once the
  // instance is known dead its claims are freed (inference/Reaper.ts; found by `npm run soak`, D291).
  "0030_idempotency_claims": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`ALTER TABLE idempotency_keys ADD COLUMN instance_id TEXT DEFAULT router_instance_of_connection()`
    yield* sql`CREATE INDEX idempotency_keys_claimed ON idempotency_keys (instance_id) WHERE state = 'in_progress'`
  }),
  // Since when an instance's heartbeats have come without a gap (db/Instances.ts, D293): after a stall of
  // its own it judges nobody dead until the others have had as long to beat again.
  "0031_instance_beating_since": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`ALTER TABLE router_instances ADD COLUMN beating_since TIMESTAMPTZ NOT NULL DEFAULT '-infinity'`
  }),
  // Captured credit requests not yet folded into their key's and owner's rows (ledger/CreditFold.ts, D315):
  // a capture inserts one row here instead of updating the two hot rows; the fold pass deletes them and
  // applies their sums. `api_keys.folded` is what the folds have given back to the key (Σ authorized −
  // charged), so a reservation can tell a fold that committed during its statement (D317). The views are
  // what every reader of the figures reads: the rows with the unfolded captures counted.
  "0033_credit_fold": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      CREATE TABLE credit_unfolded (
        request_id TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        wallet TEXT NOT NULL,
        authorized BIGINT NOT NULL CHECK (authorized >= 0),
        charged BIGINT NOT NULL CHECK (charged >= 0 AND charged <= authorized)
      )
    `
    yield* sql`CREATE INDEX credit_unfolded_key ON credit_unfolded (key_id)`
    yield* sql`ALTER TABLE api_keys ADD COLUMN folded BIGINT NOT NULL DEFAULT 0`
    yield* sql`
      CREATE VIEW key_figures AS
      SELECT k.key_id, k.spent + coalesce(u.charged, 0) AS spent, k.reserved - coalesce(u.authorized, 0) AS reserved
      FROM api_keys k
      LEFT JOIN LATERAL (
        SELECT sum(c.charged) AS charged, sum(c.authorized) AS authorized FROM credit_unfolded c WHERE c.key_id = k.key_id
      ) u ON true
    `
    yield* sql`
      CREATE VIEW balance_figures AS
      SELECT b.wallet, b.available + coalesce(u.authorized - u.charged, 0) AS available,
             b.reserved - coalesce(u.authorized, 0) AS reserved
      FROM wallet_balances b
      LEFT JOIN LATERAL (
        SELECT sum(c.charged) AS charged, sum(c.authorized) AS authorized FROM credit_unfolded c WHERE c.wallet = b.wallet
      ) u ON true
    `
  }),
  // What each x402 payer has committed and not yet settled (the sum of its authorizations `reserved`,
  // `pending` or `submitted`), kept by a trigger on every insert, update and delete of an authorization:
  // the reservation checks a new authorization against the payer's balance on this one row, locked and
  // re-read by the statement itself, instead of a transaction that took an advisory lock and summed
  // (ledger/Reserve.ts, D327).
  "0034_x402_outstanding": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`
      CREATE TABLE x402_outstanding (
        payer TEXT PRIMARY KEY,
        outstanding NUMERIC NOT NULL DEFAULT 0 CHECK (outstanding >= 0)
      )
    `
    yield* sql`
      CREATE FUNCTION x402_outstanding_track() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE
        was NUMERIC := 0;
        now_ NUMERIC := 0;
        who TEXT;
      BEGIN
        IF TG_OP <> 'INSERT' AND OLD.status IN ('reserved', 'pending', 'submitted') THEN was := OLD.value; END IF;
        IF TG_OP <> 'DELETE' AND NEW.status IN ('reserved', 'pending', 'submitted') THEN now_ := NEW.value; END IF;
        IF TG_OP = 'UPDATE' AND OLD.payer <> NEW.payer THEN
          UPDATE x402_outstanding SET outstanding = outstanding - was WHERE payer = OLD.payer;
          was := 0;
        END IF;
        IF now_ <> was THEN
          who := CASE WHEN TG_OP = 'DELETE' THEN OLD.payer ELSE NEW.payer END;
          UPDATE x402_outstanding SET outstanding = outstanding + (now_ - was) WHERE payer = who;
          -- A payer's first authorization (the reservation makes the row first; a direct insert may not).
          -- The proposed row meets the CHECK before any conflict, so only a first, positive value gets here.
          IF NOT FOUND THEN
            INSERT INTO x402_outstanding AS o (payer, outstanding) VALUES (who, now_ - was)
            ON CONFLICT (payer) DO UPDATE SET outstanding = o.outstanding + EXCLUDED.outstanding;
          END IF;
        END IF;
        RETURN NULL;
      END $$
    `
    yield* sql`
      CREATE TRIGGER x402_outstanding_track AFTER INSERT OR UPDATE OF status, value, payer OR DELETE
      ON x402_authorizations FOR EACH ROW EXECUTE FUNCTION x402_outstanding_track()
    `
    yield* sql`
      INSERT INTO x402_outstanding (payer, outstanding)
      SELECT payer, sum(value) FROM x402_authorizations
      WHERE status IN ('reserved', 'pending', 'submitted') GROUP BY payer
    `
  }),
  // The fold queue read by wallet (`balance_figures`, a withdrawal's pre-check, the credits balance): without
  // it each read scans the whole queue, which grows when folding stalls (D318).
  "0035_credit_unfolded_wallet": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`CREATE INDEX credit_unfolded_wallet ON credit_unfolded (wallet)`
  })
}
