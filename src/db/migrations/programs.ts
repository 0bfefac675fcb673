import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/** The programs around the paid path: points and model integrity, agent setup, durable tasks, workspaces and evaluations. */
export const programs: Migrations = {
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
  "0026_task_lineage_indexes": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // A task's view lists its forks (by parent task, in creation order), and erasing a task keeps the
    // snapshots a fork still names (by parent snapshot): without these both read every task. Only forks
    // carry a lineage, so the indexes hold only them.
    yield* sql`
      CREATE INDEX tasks_parent_task ON tasks (parent_task_id, created_at) WHERE parent_task_id IS NOT NULL
    `
    yield* sql`
      CREATE INDEX tasks_parent_snapshot ON tasks (parent_snapshot_id) WHERE parent_snapshot_id IS NOT NULL
    `
  })
}
