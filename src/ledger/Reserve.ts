import { Effect, Schedule, Schema } from "effect"
import type { NonEmptyReadonlyArray } from "effect/Array"
import type { SqlClient, SqlError, Statement } from "effect/sql"
import { type Hex, hexToBigInt, toHex } from "viem"
import { commitWithoutFlush } from "../db/AsyncCommit.ts"
import { databaseUnavailable, isCheckViolation, pgFault } from "../db/SqlFaults.ts"
import type { ServiceUnavailable } from "../domain/Errors.ts"
import { acquireCapacity, LEASE_TTL, type LeaseRequest } from "../market/QuoteBook.ts"
import { retryAfterFailure } from "../process/Retry.ts"
import { traced } from "../Telemetry.ts"

/** An x402 authorization that cannot be reserved: its nonce was seen, or the payer's balance is spoken for. */
export class NonceReplay extends Schema.TaggedError<NonceReplay>()("NonceReplay", {
  payer: Schema.String,
  reason: Schema.optionalKey(Schema.Literals(["nonce_replay", "overcommitted"]))
}) {
  get refusal() {
    return this.reason === "overcommitted" ? OVERCOMMITTED : "authorization already used"
  }
}

/** A withdrawal's retries (D543): three, 100, 200 and 400 ms apart. */
const WITHDRAW_RETRY = { schedule: Schedule.exponential("100 millis"), times: 3 }

/** Why an authorization that would take the payer's unsettled ones beyond the balance is refused. */
export const OVERCOMMITTED = "the payer's balance is already committed to authorizations not yet settled"

/** A funded key could not cover a reservation: its cap, or its owner's balance. */
export class CreditRefused extends Schema.TaggedError<CreditRefused>()("CreditRefused", {
  code: Schema.Literals(["key_budget_exhausted", "key_unfunded"])
}) {}

/**
 * A credit key that fails a gate of the reservation: unknown or revoked, expired, read-only, or its
 * owner not invited. Nothing was written.
 */
export class KeyRefused extends Schema.TaggedError<KeyRefused>()("KeyRefused", {
  reason: Schema.Literals(["unknown", "expired", "cannot_spend", "not_invited"])
}) {}

/** Which key a reservation draws on: one resolved before, or a secret's hash read with the router's clock. */
type KeyRef =
  | { readonly _tag: "Id"; readonly keyId: string }
  | { readonly _tag: "Secret"; readonly keyHash: string; readonly nowMs: number }

/** An x402 reservation: with a `lease` in the record, whether its statement took it (D311). */
export interface X402Reserved {
  readonly leaseGranted?: boolean | undefined
  /**
   * The payer's authorizations not yet settled, this one included, as the statement left them (base
   * units): held against the balance the chain reports when the reservation did not wait for it (D543).
   */
  readonly outstanding: bigint
}

/** A reservation on a funded key: whose key, and what it may still spend after it. */
export interface CreditReserved {
  readonly keyId: string
  readonly wallet: string
  readonly keyRemaining: number
  /** With a `lease` in the record: whether the statement took it (false: the quote's ceiling is reached). */
  readonly leaseGranted?: boolean | undefined
}

export interface ReservationRecord {
  readonly requestId: string
  readonly dialect: string
  readonly payer: string
  readonly requestedModel: string
  readonly modelClass: string
  readonly providerId: string
  readonly authorized: number
  readonly agent: Record<string, string>
  readonly sessionId?: string | undefined
  /**
   * A capacity lease on the winner's quote, taken by a key's or an x402 reservation's own statement
   * (D311); a session turn's takes none.
   */
  readonly lease?: LeaseRequest | undefined
}

export interface X402Hold {
  /** `exact` unless said; an `upto` hold's value is its ceiling, and its nonce key is `uptoNonceKey`. */
  readonly scheme?: "exact" | "upto"
  readonly nonce: Hex | UptoNonceKey
  readonly validAfter: bigint
  readonly validBefore: bigint
  readonly signature: Hex
  /**
   * The payer's on-chain balance read during verification. With it, the reservation refuses an
   * authorization that, with the payer's others not yet settled, would exceed the balance: one
   * balance never pays for two requests.
   */
  readonly balance?: bigint | undefined
}

/** How an `upto` authorization's Permit2 nonce is keyed in `x402_authorizations` (migration 0016). */
export type UptoNonceKey = `permit2:0x${string}`
export const uptoNonceKey = (nonce: bigint): UptoNonceKey => `permit2:${toHex(nonce, { size: 32 })}`
/** The Permit2 nonce of an `upto` row's key. */
export const permit2NonceOf = (key: string): bigint => hexToBigInt(key.slice("permit2:".length) as Hex)

const isUniqueViolation = (error: SqlError.SqlError) => error.reason._tag === "UniqueViolation"

/**
 * The reservation statements of the paid path: an x402 authorization, a funded key's worst case, a
 * session turn. Each is one statement (one round trip) that writes the request, its hold and its
 * ledger row together or not at all.
 */
export const makeReservations = (sql: SqlClient.SqlClient) => {
  /**
   * A reservation is on every paid call's first-byte path: its commit does not wait for the disk (D542).
   * Waiting for the flush was about 0.85 ms of its 2.1 ms round trip at 50 calls a second, with a key's row
   * locked through it. What a crash of the database server before the flush can lose is a reservation whose
   * call has not been captured (the capture waits for the disk, and flushes it first): a call served and
   * not charged. A session turn's reservation waits: the turn's claim on its session (`in_flight`) is
   * committed before it, and a lost turn would leave the session busy with a request that is nowhere, so
   * never closed and its budget never let go.
   */
  const flushLater = commitWithoutFlush(sql)

  /**
   * The body of a reservation statement's `lease` CTE (D311): the record's capacity lease, taken once
   * the CTE `written` has its row (the reservation is made), after every row lock the statement takes
   * before it, so all such statements lock in one order; none asked for, none taken.
   */
  const leaseOnceWritten = (lease: LeaseRequest | undefined, written: string) =>
    lease === undefined
      ? sql`SELECT NULL::boolean AS granted`
      : sql`SELECT ${acquireCapacity(sql, lease)} AS granted FROM ${sql.literal(written)}`

  /**
   * One statement, one round trip, on the first-byte path: the request, its authorization
   * and the ledger row land together or not at all. A (payer, nonce) seen before violates
   * the primary key and the whole statement fails: a replay never reserves anything.
   *
   * With the balance the chain reported, the payer's authorizations not yet settled plus this one
   * must fit it (they have not moved any money yet): the statement first adds this value to the payer's
   * `x402_outstanding` row (migration 0034, kept by triggers on `x402_authorizations` for every later
   * change) and goes on only when the row's outstanding plus this value is within the balance. Under READ COMMITTED
   * Postgres evaluates that condition on the row as it stands once locked, so a concurrent
   * reservation for the same payer waits for this one to commit and then sees its value (D327).
   */
  const reserveX402 = Effect.fnUntraced(function* (record: ReservationRecord, hold: X402Hold) {
    const payer = record.payer.toLowerCase()
    const scheme = hold.scheme ?? "exact"
    const ceiling = scheme === "upto" ? record.authorized : null
    const balance = hold.balance?.toString() ?? null
    // The guard adds the value to the payer's row itself, one write (D442): the authorization it lets in is
    // marked counted, so the insert trigger does not add it again. Without a balance there is nothing to check.
    const fits = (total: Statement.Fragment) =>
      balance === null ? sql`true` : sql`${total} <= ${balance}::numeric`
    const guard = sql`INSERT INTO x402_outstanding AS o (payer, outstanding)
              SELECT ${payer}, ${record.authorized} WHERE ${fits(sql`${record.authorized}`)}
              ON CONFLICT (payer) DO UPDATE SET outstanding = o.outstanding + EXCLUDED.outstanding
              WHERE ${fits(sql`o.outstanding + EXCLUDED.outstanding`)}
              RETURNING payer, outstanding`
    const rows = yield* sql<{ reserved: number; lease_granted: boolean | null; outstanding: string | null }>`
      WITH guard AS (${guard}), request AS (
        INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                              provider_id, authorized, status, agent, session_id)
        SELECT ${record.requestId}, ${record.dialect}, 'x402', ${payer}, ${record.requestedModel},
               ${record.modelClass}, ${record.providerId}, ${record.authorized}, 'reserved',
               ${JSON.stringify(record.agent)}::jsonb, ${record.sessionId ?? null}
        FROM guard
        RETURNING request_id
      ), hold AS (
        INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                         signature, status, scheme, ceiling, outstanding_counted)
        SELECT ${payer}, ${hold.nonce.toLowerCase()}, request_id, ${record.authorized},
               ${hold.validAfter.toString()}, ${hold.validBefore.toString()}, ${hold.signature}, 'reserved',
               ${scheme}, ${ceiling}, true
        FROM request
        RETURNING request_id
      ), entry AS (
        INSERT INTO ledger_entries (request_id, account, kind, amount)
        SELECT request_id, ${payer}, 'authorization_reserved', ${record.authorized} FROM hold
        RETURNING request_id
      ), lease AS (${leaseOnceWritten(record.lease, "entry")})
      SELECT (SELECT count(*)::int FROM entry) AS reserved, (SELECT granted FROM lease) AS lease_granted,
             (SELECT outstanding::text FROM guard) AS outstanding, ${flushLater}
    `.pipe(
      Effect.catchTag(
        "SqlError",
        (error): Effect.Effect<never, NonceReplay | ServiceUnavailable> =>
          isUniqueViolation(error)
            ? Effect.fail(new NonceReplay({ payer, reason: "nonce_replay" }))
            : Effect.fail(databaseUnavailable(error))
      )
    )
    if (rows[0]?.reserved !== 1) return yield* new NonceReplay({ payer, reason: "overcommitted" })
    return {
      leaseGranted: rows[0].lease_granted ?? undefined,
      outstanding: BigInt(rows[0].outstanding ?? record.authorized)
    } satisfies X402Reserved
  }, traced("Ledger.reserveX402"))

  /**
   * Takes back an x402 reservation the chain then refused (D543), in one statement: its lease, its
   * authorization (the payer's outstanding sum goes down by its trigger), its ledger row and its request,
   * only while nothing else has touched it (still `reserved`). Nothing was served and no money moved: the
   * book is as it was before the call, as when the chain's answer came first. The payer's row is locked
   * first, as every statement that moves the payer's sum takes it (D513, D519): a reservation of the same
   * nonce (the guard takes that row, then the nonce's key) waits for this one instead of deadlocking with
   * it. A database fault is tried again, three times within about a second, then logged and left to the
   * reaper, which releases the request as a call that delivered nothing.
   */
  const withdrawX402 = (requestId: string, payer: string, lease: LeaseRequest | undefined) =>
    sql`
      WITH payer_locked AS (
        SELECT count(*) AS n FROM (
          SELECT 1 FROM x402_outstanding WHERE payer = ${payer.toLowerCase()} FOR UPDATE
        ) l
      ), hold AS (
        DELETE FROM x402_authorizations
        WHERE request_id = ${requestId} AND status = 'reserved' AND (SELECT n FROM payer_locked) >= 0
        RETURNING request_id
      ), entry AS (
        DELETE FROM ledger_entries
        WHERE request_id IN (SELECT request_id FROM hold) AND kind = 'authorization_reserved'
      ), lease AS (
        DELETE FROM capacity_leases
        WHERE lease_id = ${lease?.leaseId ?? null} AND EXISTS (SELECT 1 FROM hold)
      )
      DELETE FROM requests WHERE request_id IN (SELECT request_id FROM hold) AND status = 'reserved'
    `.pipe(
      Effect.asVoid,
      Effect.retry(WITHDRAW_RETRY),
      Effect.catchTag("SqlError", (error) =>
        Effect.logWarning("an x402 reservation the chain refused was not withdrawn; the reaper releases it", {
          request_id: requestId,
          error: pgFault(error)
        })
      ),
      traced("Ledger.withdrawX402")
    )

  /**
   * A session turn takes no money of its own: it holds its session (one turn at a time) and
   * records the request with its worst case drawn on the session's budget.
   */
  const reserveSessionTurn = Effect.fnUntraced(function* (record: ReservationRecord) {
    yield* sql`
      WITH request AS (
        INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                              provider_id, authorized, status, agent, session_id)
        VALUES (${record.requestId}, ${record.dialect}, 'session', ${record.payer.toLowerCase()},
                ${record.requestedModel}, ${record.modelClass}, ${record.providerId}, ${record.authorized},
                'reserved', ${JSON.stringify(record.agent)}::jsonb, ${record.sessionId ?? null})
        RETURNING request_id, payer
      )
      INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
      SELECT request_id, payer, 'session_reserved', ${record.authorized}, ${record.sessionId ?? null} FROM request
    `.pipe(Effect.catchTag("SqlError", (error) => Effect.fail(databaseUnavailable(error))))
  }, traced("Ledger.reserveSessionTurn"))

  /**
   * One statement: the key (found, live, able to spend, its owner invited), the key's cap, the owner's
   * balance, and for each record its request row and its ledger row. A key that fails a gate writes nothing
   * and says which gate (`KeyRefused`); over the cap or the balance, a CHECK constraint fails and nothing is
   * written; an owner with no balance row trips the division guard. Any number of router instances share it.
   *
   * The records are reserved together (the reservations of one key made in one turn, D545): the key's and
   * the balance's rows are updated once, by their sum, and each record is answered as if reserved alone, one
   * after another in their order. All of them fit or none is written.
   *
   * The cap and the balance are checked on the rows as folded (D315): captures not folded yet still hold
   * their worst case, so a key near its cap may be refused for up to one fold pass, never let past it.
   * What the key may still spend counts them (D317): the key row as updated (latest), plus what the
   * queue held in this statement's snapshot, less what folds committed since that snapshot gave back
   * (`folded` moved), which the latest row already counts. Never more than the truth; exact unless a
   * capture commits while this statement waits for the key's row.
   *
   * A record with a `lease` takes its capacity lease in the same statement once the request rows are written
   * (after the key's and the balance's row locks, so every such statement locks in one order; leases in
   * (provider, class) order), and says whether it was granted; a refused reservation takes none (D311).
   */
  const reserveWithKey = (
    records: NonEmptyReadonlyArray<Omit<ReservationRecord, "payer">>,
    key: KeyRef
  ): Effect.Effect<ReadonlyArray<CreditReserved>, KeyRefused | CreditRefused | ServiceUnavailable> => {
    const found =
      key._tag === "Id"
        ? sql`SELECT key_id, 'credit' AS kind, true AS invited, false AS expired, folded
              FROM api_keys WHERE key_id = ${key.keyId} AND revoked_at IS NULL`
        : // Expiry against the router's clock (tests move it), to the second as the key registry reads it.
          sql`SELECT k.key_id, k.kind, coalesce(o.invited, false) AS invited,
                     coalesce(extract(epoch FROM k.expires_at)::bigint * 1000 <= ${key.nowMs}, false) AS expired,
                     k.folded
              FROM api_keys k LEFT JOIN wallets o ON o.wallet = k.wallet
              WHERE k.key_hash = ${key.keyHash} AND k.revoked_at IS NULL`
    const batch = records.map((record, ord) => ({
      ord,
      request_id: record.requestId,
      dialect: record.dialect,
      requested_model: record.requestedModel,
      model_class: record.modelClass,
      provider_id: record.providerId,
      authorized: record.authorized,
      agent: record.agent,
      session_id: record.sessionId ?? null,
      lease_id: record.lease?.leaseId ?? null,
      lease_provider: record.lease?.providerId ?? null,
      lease_class: record.lease?.modelClass ?? null,
      lease_capacity: record.lease?.capacity ?? null
    }))
    return sql<{
      key_id: string
      kind: string
      invited: boolean
      expired: boolean
      wallet: string | null
      remaining: string | null
      guard: number | null
      leases: Record<string, boolean> | null
    }>`
      WITH batch AS (
        SELECT * FROM jsonb_to_recordset(${JSON.stringify(batch)}::jsonb) AS b(
          ord int, request_id text, dialect text, requested_model text, model_class text, provider_id text,
          authorized bigint, agent jsonb, session_id text, lease_id text, lease_provider text, lease_class text,
          lease_capacity int
        )
      ), total AS (
        SELECT sum(authorized) AS amount, count(*)::int AS n FROM batch
      ), found AS (${found}), k AS (
        UPDATE api_keys SET reserved = reserved + (SELECT amount FROM total), requests = requests + (SELECT n FROM total)
        WHERE key_id = (SELECT key_id FROM found WHERE kind = 'credit' AND invited AND NOT expired)
          AND revoked_at IS NULL
        RETURNING key_id, wallet, budget - spent - reserved AS remaining, folded
      ), w AS (
        UPDATE wallet_balances
        SET available = available - (SELECT amount FROM total), reserved = reserved + (SELECT amount FROM total),
            updated_at = now()
        WHERE wallet = (SELECT wallet FROM k)
        RETURNING wallet
      ), request AS (
        INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                              provider_id, authorized, status, agent, key_id, session_id)
        SELECT b.request_id, b.dialect, 'credit', w.wallet, b.requested_model, b.model_class, b.provider_id,
               b.authorized, 'reserved', b.agent, k.key_id, b.session_id
        FROM batch b, w, k
        ORDER BY b.ord
        RETURNING request_id, payer, authorized
      ), entry AS (
        INSERT INTO ledger_entries (request_id, account, kind, amount)
        SELECT request_id, payer, 'credit_reserved', authorized FROM request
      ), lease AS (
        SELECT b.request_id,
               acquire_capacity(b.lease_provider, b.lease_class, b.lease_capacity, b.lease_id, ${LEASE_TTL}::interval)
                 AS granted
        FROM batch b JOIN request r ON r.request_id = b.request_id
        WHERE b.lease_id IS NOT NULL
        ORDER BY b.lease_provider, b.lease_class, b.ord
      )
      SELECT found.key_id, found.kind, found.invited, found.expired, (SELECT wallet FROM k) AS wallet,
             (SELECT greatest(k.remaining,
                              k.remaining + credit_unfolded_held(k.key_id) - (k.folded - found.folded))
              FROM k)::text AS remaining, (SELECT jsonb_object_agg(request_id, granted) FROM lease) AS leases,
             CASE WHEN EXISTS (SELECT 1 FROM k) THEN 1 / (SELECT count(*)::int FROM w) END AS guard,
             ${flushLater}
      FROM found
    `.pipe(
      // Two statements that lock the same key and balance rows can meet in a deadlock (Postgres aborts
      // one); the statement is atomic, so it is run again.
      retryAfterFailure({ while: (error) => error.reason._tag === "DeadlockError", times: 3 }),
      // Refusals are the schema's own: the key's cap (`api_keys_within_budget`), the owner's balance
      // (`wallet_balances` never below zero) or no balance row at all (the division guard, SQLSTATE
      // 22012). Anything else is the database failing, a 503 to retry, never a 402.
      Effect.catchTag("SqlError", (error): Effect.Effect<never, CreditRefused | ServiceUnavailable> => {
        const fault = pgFault(error)
        if (isCheckViolation(fault, (name) => name === "api_keys_within_budget")) {
          return Effect.fail(new CreditRefused({ code: "key_budget_exhausted" }))
        }
        if (
          isCheckViolation(fault, (name) => name.startsWith("wallet_balances_")) ||
          fault.sqlState === "22012"
        ) {
          return Effect.fail(new CreditRefused({ code: "key_unfunded" }))
        }
        return Effect.fail(databaseUnavailable(error))
      }),
      Effect.flatMap((rows) => {
        const row = rows[0]
        if (row === undefined) return Effect.fail(new KeyRefused({ reason: "unknown" }))
        if (row.expired) return Effect.fail(new KeyRefused({ reason: "expired" }))
        if (row.kind !== "credit") return Effect.fail(new KeyRefused({ reason: "cannot_spend" }))
        if (!row.invited) return Effect.fail(new KeyRefused({ reason: "not_invited" }))
        // Found but not updated: revoked by a statement that committed after this one's snapshot (the
        // update skips the row). Nothing was reserved, so nothing may be served.
        if (row.wallet === null) return Effect.fail(new KeyRefused({ reason: "unknown" }))
        const { key_id: keyId, wallet, leases } = row
        // Each record as if reserved alone in its turn: what the key had left after the whole batch, plus
        // what the records after it took.
        let after = Number(row.remaining ?? 0)
        const answers = new Array<CreditReserved>(records.length)
        for (let i = records.length - 1; i >= 0; i--) {
          const record = records[i]!
          answers[i] = {
            keyId,
            wallet,
            keyRemaining: after,
            leaseGranted: record.lease === undefined ? undefined : leases?.[record.requestId] === true
          }
          after += record.authorized
        }
        return Effect.succeed(answers)
      })
    )
  }

  /** A key resolved before (its id): the reservation alone. */
  const reserveCredit = (record: ReservationRecord, keyId: string) =>
    Effect.map(reserveWithKey([record], { _tag: "Id", keyId }), (answers) => answers[0]!)

  /**
   * The paid path's statement for a key as sent (`x-credit-key`, by the SHA-256 of its secret): resolving the
   * key and reserving on it are one round trip, for one record or for the key's records of one turn (D545).
   */
  const reserveCreditKeys = (
    records: NonEmptyReadonlyArray<Omit<ReservationRecord, "payer">>,
    keyHash: string,
    nowMs: number
  ) => reserveWithKey(records, { _tag: "Secret", keyHash, nowMs })

  /** One record on a key as sent, alone. */
  const reserveCreditKey = (record: Omit<ReservationRecord, "payer">, keyHash: string, nowMs: number) =>
    Effect.map(reserveCreditKeys([record], keyHash, nowMs), (answers) => answers[0]!)

  return { reserveX402, withdrawX402, reserveCredit, reserveCreditKey, reserveCreditKeys, reserveSessionTurn }
}
