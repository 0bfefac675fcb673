import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { Hex } from "viem"

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
  ceiling: Schema.NullOr(Schema.String)
})
export type ClaimedAuthorization = typeof ClaimedAuthorization.Type
const decodeClaimed = Schema.decodeUnknownEffect(Schema.Array(ClaimedAuthorization))

/** Retry backoff for a failed submission: 2 s, 4 s, ... capped at 60 s. */
const backoffSeconds = (attempts: number) => Math.min(60, 2 ** Math.min(6, attempts))

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
    /** The claims of instances known dead go back to the queue now; returns how many. */
    readonly releaseClaimsOf: (instanceIds: ReadonlyArray<string>) => Effect.Effect<number>
    /** Claims up to `CLAIM_LIMIT` due authorizations for submission. */
    readonly claimDue: Effect.Effect<ReadonlyArray<ClaimedAuthorization>>
    /** Records the hash of a broadcast transfer before it is awaited. */
    readonly recordBroadcast: (row: ClaimedAuthorization, hash: Hex) => Effect.Effect<void>
    /** Records the landing once (only the claim that still holds the row); false when it was not ours. */
    readonly recordLanded: (row: ClaimedAuthorization, hash: Hex) => Effect.Effect<boolean>
    /** Back to `pending` with a backoff, or `failed` when expired (the session it funded dies). */
    readonly recordFailed: (
      row: ClaimedAuthorization,
      reason: string,
      expired: boolean
    ) => Effect.Effect<void>
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
                  attempts, scheme, ceiling::text
      `.pipe(Effect.flatMap(decodeClaimed), Effect.orDie)

      const recordBroadcast = (row: ClaimedAuthorization, hash: Hex) =>
        sql`UPDATE x402_authorizations SET tx_hash = ${hash} WHERE payer = ${row.payer} AND nonce = ${row.nonce}`.pipe(
          Effect.asVoid,
          Effect.orDie
        )

      /**
       * The landing in one statement (D333): the authorization (only while this claim holds it, `submitted`),
       * its ledger row, and the deposit it funds when it funds one (credited exactly once, never without
       * its transfer: the deposit's CTEs run only when the landing's update matched). Data-modifying CTEs
       * run exactly once and commit or fail together; it was a transaction of three statements.
       */
      const recordLanded = (row: ClaimedAuthorization, hash: Hex) =>
        sql<{ landed: number }>`
          WITH landed AS (
            UPDATE x402_authorizations SET status = 'landed', tx_hash = ${hash}, signature = NULL, updated_at = now()
            WHERE payer = ${row.payer} AND nonce = ${row.nonce} AND status = 'submitted'
            RETURNING nonce
          ), credited AS (
            UPDATE deposits SET status = 'credited', credited_at = now()
            WHERE request_id = ${row.request_id} AND status = 'pending' AND EXISTS (SELECT 1 FROM landed)
            RETURNING deposit_id, wallet, amount
          ), balance AS (
            INSERT INTO wallet_balances (wallet, available) SELECT wallet, amount FROM credited
            ON CONFLICT (wallet) DO UPDATE
            SET available = wallet_balances.available + EXCLUDED.available, updated_at = now()
          ), entries AS (
            -- One insert, the settlement's row first: the order of separate CTEs' writes is not defined.
            INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
            SELECT ${row.request_id}, 'treasury', 'settled', ${row.value}, ${hash} FROM landed
            UNION ALL
            SELECT ${row.request_id}, wallet, 'deposit_credited', amount, ${hash} FROM credited
          )
          SELECT count(*)::int AS landed FROM landed
        `.pipe(
          Effect.map(([counted]) => (counted?.landed ?? 0) > 0),
          Effect.orDie
        )

      // One transaction: once the authorization reads `failed`, the session it funded is already dead
      // (no reader sees a failed funding beside a session still taking turns).
      const recordFailed = (row: ClaimedAuthorization, reason: string, expired: boolean) =>
        Effect.gen(function* () {
          yield* sql`
            UPDATE x402_authorizations
            SET status = ${expired ? "failed" : "pending"}, last_error = ${reason.slice(0, 300)},
                next_attempt_at = now() + make_interval(secs => ${backoffSeconds(row.attempts)}), updated_at = now()
            WHERE payer = ${row.payer} AND nonce = ${row.nonce} AND status = 'submitted'
          `
          // A session funded by this authorization can take no further turns (402 session_dead).
          if (expired) {
            yield* sql`UPDATE sessions SET status = 'dead' WHERE funding_request_id = ${row.request_id} AND status = 'open'`
          }
        }).pipe(sql.withTransaction, Effect.orDie)

      const recover = sql`
        UPDATE x402_authorizations SET status = 'pending', updated_at = now()
        WHERE status = 'submitted' AND updated_at < now() - interval '3 minutes'
      `.pipe(Effect.asVoid, Effect.orDie)

      // A dead instance's claim may have broadcast already: the next claimer's send finds the recorded
      // transaction (ledger/Treasury.ts) and its landing is recorded once (`recordLanded` needs `submitted`).
      const releaseClaimsOf = (instanceIds: ReadonlyArray<string>) =>
        instanceIds.length === 0
          ? Effect.succeed(0)
          : sql<{ nonce: string }>`
              UPDATE x402_authorizations SET status = 'pending', next_attempt_at = now(), updated_at = now()
              WHERE status = 'submitted' AND claimed_by IN ${sql.in(instanceIds)}
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
