import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { Hex } from "viem"
import type { LeftByDead } from "../db/Instances.ts"
import { ReceiptBody } from "../domain/Receipt.ts"

/**
 * Authorizations one settlement pass claims (D426): with a pass started every 250 ms, the queue is taken
 * at up to four times this a second, so 32 carries a sustained 100 x402 calls a second with room (16, the
 * old claim, capped it at 64).
 */
export const CLAIM_LIMIT = 32

/** A captured x402 authorization claimed for submission. */
export const ClaimedAuthorization = Schema.Struct({
  payer: Schema.String,
  nonce: Schema.String,
  request_id: Schema.String,
  value: Schema.String,
  valid_after: Schema.String,
  valid_before: Schema.String,
  signature: Schema.NullOr(Schema.String),
  tx_hash: Schema.NullOr(Schema.String),
  attempts: Schema.Number,
  /** `upto`: a Permit2 witness transfer of `value` (the charge) under the signed `ceiling` (migration 0016). */
  scheme: Schema.Literals(["exact", "upto"]),
  ceiling: Schema.NullOr(Schema.String),
  /** When the payment was reserved (epoch seconds): its nonce was unspent then (D533). */
  reserved_at: Schema.String
})
export type ClaimedAuthorization = typeof ClaimedAuthorization.Type
const decodeClaimed = Schema.decodeUnknownEffect(Schema.Array(ClaimedAuthorization))

/** A claimed authorization and the hash of the transfer that settles it. */
export interface Landing {
  readonly row: ClaimedAuthorization
  readonly hash: Hex
}

/** What `recordLanded` recorded: the request ids landed now, and the receipts that now say so. */
export interface Landed {
  readonly requestIds: ReadonlyArray<string>
  readonly receipts: ReadonlyArray<ReceiptBody>
}

const LandedRows = Schema.Array(
  Schema.Struct({ request_id: Schema.String, receipt: Schema.NullOr(ReceiptBody) })
)
const decodeLanded = Schema.decodeUnknownEffect(LandedRows)

/** Retry backoff for a failed submission: 2 s, 4 s, ... capped at 60 s. */
const backoffSeconds = (attempts: number) => Math.min(60, 2 ** Math.min(6, attempts))
/**
 * Backoff for a row held until the chain can tell what spent its nonce (D533): each look reads logs and
 * blocks, and holds a claim, so it doubles on to 30 minutes (2 s, 4 s, ... 1,024 s, 1,800 s).
 */
const slowBackoffSeconds = (attempts: number) => Math.min(1_800, 2 ** Math.min(11, attempts))

/**
 * The book of captured x402 authorizations on their way to the chain: `pending` → `submitted`
 * (claimed with `FOR UPDATE SKIP LOCKED`, so instances never submit one twice) → `landed` (with its
 * `settled` ledger row and the deposit it funds) or back to `pending`, or `failed` once `validBefore`
 * passes (and the session it funded is dead).
 */
export class Authorizations extends Context.Service<
  Authorizations,
  {
    /** Rows left `submitted` by an instance that died mid-flight go back to the queue. */
    readonly recover: Effect.Effect<void>
    /**
     * The claims of instances known dead go back to the queue now, those `leftByDead` holds for by their last
     * write (a resumed instance's own are kept, D563); returns how many.
     */
    readonly releaseClaimsOf: (
      instanceIds: ReadonlyArray<string>,
      leftByDead: LeftByDead
    ) => Effect.Effect<number>
    /** Claims up to `CLAIM_LIMIT` due authorizations for submission. */
    readonly claimDue: Effect.Effect<ReadonlyArray<ClaimedAuthorization>>
    /** Records the hashes of broadcast transfers before they are awaited: one statement. */
    readonly recordBroadcast: (sent: ReadonlyArray<Landing>) => Effect.Effect<void>
    /**
     * Records landings once each (only while the claim still holds the row), with their receipts' settlement
     * facts: one statement (D492). Returns the landings recorded now (none of a claim that no longer held
     * its row) and their receipts, stored final and left for the receipt signer.
     */
    readonly recordLanded: (landings: ReadonlyArray<Landing>) => Effect.Effect<Landed>
    /**
     * Back to `pending` with a backoff (`slow`: up to 30 minutes, for a row held until the chain can tell,
     * D533), or `failed` for good when `final`: evidence that it can never pay us (expired unused, its nonce
     * spent by anything but its transfer to us). A final failure kills the session it funded. Only while this
     * claim still holds the row (`submitted` at the claim's attempt): returns whether it did.
     */
    readonly recordFailed: (
      row: ClaimedAuthorization,
      reason: string,
      options: { readonly final: boolean; readonly slow?: boolean }
    ) => Effect.Effect<boolean>
  }
>()("router/ledger/Authorizations") {
  static readonly layer = Layer.effect(
    Authorizations,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient

      const claimDue = sql`
        UPDATE x402_authorizations SET status = 'submitted', attempts = attempts + 1, updated_at = now(),
                                       claimed_by = router_instance_of_connection()
        WHERE (payer, nonce) IN (
          SELECT payer, nonce FROM x402_authorizations
          WHERE status = 'pending' AND next_attempt_at <= now()
          ORDER BY created_at LIMIT ${CLAIM_LIMIT} FOR UPDATE SKIP LOCKED
        )
        RETURNING payer, nonce, request_id, value::text, valid_after::text, valid_before::text, signature, tx_hash,
                  attempts, scheme, ceiling::text, floor(extract(epoch FROM created_at))::bigint::text AS reserved_at
      `.pipe(Effect.flatMap(decodeClaimed), Effect.orDie)

      const recordBroadcast = (sent: ReadonlyArray<Landing>) =>
        sent.length === 0
          ? Effect.void
          : sql`
              UPDATE x402_authorizations a SET tx_hash = v.hash
              FROM jsonb_to_recordset(${JSON.stringify(sent.map(({ row, hash }) => ({ payer: row.payer, nonce: row.nonce, attempts: row.attempts, hash })))}::jsonb)
                AS v(payer text, nonce text, attempts int, hash text)
              WHERE a.payer = v.payer AND a.nonce = v.nonce AND a.status = 'submitted' AND a.attempts = v.attempts
            `.pipe(Effect.asVoid, Effect.orDie)

      /**
       * Every landing of a settlement pass in one statement of data-modifying CTEs (D333, D492): each
       * authorization goes `submitted` → `landed` (only while this claim holds it; the `x402_outstanding`
       * trigger runs for each row), then, only for the rows that update matched, the deposits they fund are
       * credited with their balances, their ledger rows written (one insert: every `settled` row before any
       * `deposit_credited` one, the order readers expect; the order of separate CTEs' writes is not defined),
       * and their receipts rewritten with the settlement facts, unsigned, for the signer to sign (a reader or
       * the sweep signs one left unsigned). The payers' outstanding rows are locked first in payer order, and
       * the balances are credited in wallet order: two passes (or instances) landing several payers never
       * take two of their rows in opposite orders. The receipts' `receipts_points` trigger would lock points
       * rows in whatever order the join rewrites the receipts, so before the rewrite the statement locks the
       * receipts (request order), then their wallets' points rows (wallet order), then their providers'
       * points shards (`(provider, shard)` order, the trigger's `hashtext(request_id) & 7`): the order a
       * capture takes them in (ledger/SettleBatch.ts: a receipt row, its wallet, then its shards), so a
       * landing and a capture, or two landings, never wait on each other in a cycle (D513). Data-modifying CTEs run exactly once and commit or fail
       * together: a deposit is credited exactly once and never without its transfer.
       */
      const recordLanded = (landings: ReadonlyArray<Landing>) => {
        if (landings.length === 0) return Effect.succeed<Landed>({ requestIds: [], receipts: [] })
        const rows = landings.map(({ row, hash }) => ({ payer: row.payer, nonce: row.nonce, hash }))
        return sql`
          WITH v AS (
            SELECT * FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS v(payer text, nonce text, hash text)
          ), outstanding_locked AS (
            SELECT count(*) FROM (
              SELECT 1 FROM x402_outstanding WHERE payer IN (SELECT payer FROM v) ORDER BY payer FOR UPDATE
            ) l
          ), landed AS (
            UPDATE x402_authorizations a
            SET status = 'landed', tx_hash = v.hash, signature = NULL, updated_at = now()
            FROM v
            WHERE a.payer = v.payer AND a.nonce = v.nonce AND a.status = 'submitted'
              AND (SELECT * FROM outstanding_locked) >= 0
            RETURNING a.request_id, a.value, v.hash
          ), receipts_locked AS (
            SELECT r.request_id, lower(r.body->>'wallet') AS wallet, r.body->>'provider_id' AS provider_id
            FROM receipts r WHERE r.request_id IN (SELECT request_id FROM landed)
            ORDER BY r.request_id FOR UPDATE
          ), wallets_locked AS (
            SELECT count(*) FROM (
              SELECT 1 FROM points_wallets WHERE wallet IN (SELECT wallet FROM receipts_locked)
              ORDER BY wallet FOR UPDATE
            ) l
          ), providers_locked AS (
            SELECT count(*) FROM (
              SELECT 1 FROM points_providers
              WHERE (provider_id, shard) IN (SELECT provider_id, hashtext(request_id) & 7 FROM receipts_locked)
                AND (SELECT * FROM wallets_locked) >= 0
              ORDER BY provider_id, shard FOR UPDATE
            ) l
          ), credited AS (
            UPDATE deposits d SET status = 'credited', credited_at = now()
            FROM landed l
            WHERE d.request_id = l.request_id AND d.status = 'pending'
            RETURNING d.request_id, d.wallet, d.amount, l.hash
          ), balance AS (
            INSERT INTO wallet_balances (wallet, available)
            SELECT wallet, sum(amount) FROM credited GROUP BY wallet ORDER BY wallet
            ON CONFLICT (wallet) DO UPDATE
            SET available = wallet_balances.available + EXCLUDED.available, updated_at = now()
          ), entries AS (
            INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
            SELECT request_id, 'treasury', 'settled', value, hash FROM landed
            UNION ALL
            SELECT request_id, wallet, 'deposit_credited', amount, hash FROM credited
          ), finalized AS (
            UPDATE receipts r
            SET body = r.body || jsonb_build_object('payment_ref', l.hash, 'settlement', 'landed'),
                signature = NULL, final = false, updated_at = now()
            FROM landed l
            WHERE r.request_id = l.request_id AND (SELECT * FROM providers_locked) >= 0
            RETURNING r.request_id, r.body
          )
          SELECT l.request_id, f.body AS receipt FROM landed l LEFT JOIN finalized f ON f.request_id = l.request_id
        `.pipe(
          // Rows are locked in a fixed order, but an epoch's close locks its receipts in its own: a deadlock
          // aborts this statement whole, so it runs again.
          Effect.retry({ while: (error) => error.reason._tag === "DeadlockError", times: 3 }),
          Effect.flatMap(decodeLanded),
          Effect.map(
            (landed): Landed => ({
              requestIds: landed.map((row) => row.request_id),
              receipts: landed.flatMap((row) => (row.receipt === null ? [] : [row.receipt]))
            })
          ),
          Effect.orDie
        )
      }

      // One transaction: once the authorization reads `failed`, the session it funded is already dead
      // (no reader sees a failed funding beside a session still taking turns).
      const recordFailed = (
        row: ClaimedAuthorization,
        reason: string,
        { final, slow = false }: { readonly final: boolean; readonly slow?: boolean }
      ) =>
        Effect.gen(function* () {
          const backoff = slow ? slowBackoffSeconds(row.attempts) : backoffSeconds(row.attempts)
          const held = yield* sql`
            UPDATE x402_authorizations
            SET status = ${final ? "failed" : "pending"}, last_error = ${reason.slice(0, 300)},
                next_attempt_at = now() + make_interval(secs => ${backoff}), updated_at = now()
            WHERE payer = ${row.payer} AND nonce = ${row.nonce} AND status = 'submitted' AND attempts = ${row.attempts}
            RETURNING request_id
          `
          // A session funded by this authorization can take no further turns (402 session_dead).
          if (final && held.length > 0) {
            yield* sql`UPDATE sessions SET status = 'dead' WHERE funding_request_id = ${row.request_id} AND status = 'open'`
          }
          return held.length > 0
        }).pipe(sql.withTransaction, Effect.orDie)

      const recover = sql`
        UPDATE x402_authorizations SET status = 'pending', updated_at = now()
        WHERE status = 'submitted' AND updated_at < now() - interval '3 minutes'
      `.pipe(Effect.asVoid, Effect.orDie)

      // A dead instance's claim may have broadcast already: the next claimer's send finds the recorded
      // transaction (ledger/Treasury.ts) and its landing is recorded once (`recordLanded` needs `submitted`).
      const releaseClaimsOf = (instanceIds: ReadonlyArray<string>, leftByDead: LeftByDead) =>
        instanceIds.length === 0
          ? Effect.succeed(0)
          : sql<{ nonce: string }>`
              UPDATE x402_authorizations SET status = 'pending', next_attempt_at = now(), updated_at = now()
              WHERE status = 'submitted' AND claimed_by IN ${sql.in(instanceIds)}
                AND EXISTS (SELECT 1 FROM router_instances
                            WHERE ${leftByDead(sql`x402_authorizations.claimed_by`, sql`x402_authorizations.updated_at`)})
              RETURNING nonce
            `.pipe(
              Effect.map((rows) => rows.length),
              Effect.orDie
            )

      return Authorizations.of({
        recover,
        releaseClaimsOf,
        claimDue,
        recordBroadcast,
        recordLanded,
        recordFailed
      })
    })
  )
}
