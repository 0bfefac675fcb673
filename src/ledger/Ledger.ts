import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type SqlError } from "effect/sql"
import type { Hex } from "viem"
import { Chain } from "../chain/Chain.ts"
import { feeSplit } from "../domain/Billing.ts"
import { ReceiptBody, receiptTypedData } from "./Receipt.ts"

/** An x402 authorization that cannot be reserved: its nonce was seen, or the payer's balance is spoken for. */
export class NonceReplay extends Schema.TaggedError<NonceReplay>()("NonceReplay", {
  payer: Schema.String,
  reason: Schema.optionalKey(Schema.Literals(["nonce_replay", "overcommitted"]))
}) {
  get refusal() {
    return this.reason === "overcommitted"
      ? "the payer's balance is already committed to authorizations not yet settled"
      : "authorization already used"
  }
}

/** A funded key could not cover a reservation: its cap, or its owner's balance. */
export class CreditRefused extends Schema.TaggedError<CreditRefused>()("CreditRefused", {
  code: Schema.Literals(["key_budget_exhausted", "key_unfunded"])
}) {}

/** How a captured request was paid: an x402 authorization, or a funded key's reservation. */
export type PaymentSource =
  | { readonly _tag: "X402" }
  | { readonly _tag: "Credit"; readonly keyId: string }
  /** The call that opened a session: its authorization or key reservation is the session budget. */
  | {
      readonly _tag: "SessionOpening"
      readonly sessionId: string
      readonly funding: { readonly _tag: "X402" } | { readonly _tag: "Credit"; readonly keyId: string }
      readonly prefixTokens: number
    }
  /** A later turn, drawn on its session's budget. */
  | { readonly _tag: "SessionTurn"; readonly sessionId: string; readonly prefixTokens: number }

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
}

export interface X402Hold {
  readonly nonce: Hex
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

export interface CaptureRecord {
  readonly receipt: ReceiptBody
  readonly economics: unknown
  /** Defaults to an x402 authorization. */
  readonly source?: PaymentSource | undefined
}

const X402Source: PaymentSource = { _tag: "X402" }

/** A reservation still open: what the reaper needs to release it. */
export const StaleReservation = Schema.Struct({
  request_id: Schema.String,
  payment_kind: Schema.Literals(["x402", "credit", "session"]),
  payer: Schema.String,
  authorized: Schema.NumberFromString,
  key_id: Schema.NullOr(Schema.String),
  session_id: Schema.NullOr(Schema.String),
  opens_session: Schema.Boolean,
  model_class: Schema.String,
  provider_id: Schema.String,
  created_at: Schema.Number
})
export type StaleReservation = typeof StaleReservation.Type
const decodeStale = Schema.decodeUnknownEffect(Schema.Array(StaleReservation))

const decodeReceipt = Schema.decodeUnknownEffect(ReceiptBody)

const isUniqueViolation = (error: SqlError.SqlError) => error.reason._tag === "UniqueViolation"

/**
 * The book of record for paid requests. Every movement of money is an append-only
 * `ledger_entries` row written in the same transaction as the state it changes.
 */
export class Ledger extends Context.Service<
  Ledger,
  {
    /** Reserves an x402 authorization for a request; a nonce seen before fails `NonceReplay`. */
    readonly reserveX402: (record: ReservationRecord, hold: X402Hold) => Effect.Effect<void, NonceReplay>
    readonly nonceUnused: (payer: string, nonce: Hex) => Effect.Effect<boolean>
    readonly reserveSessionTurn: (record: ReservationRecord) => Effect.Effect<void>
    /**
     * Reserves the worst case from a funded key's owner balance within the key's cap, in one
     * statement. Returns what the key may still spend after this reservation.
     */
    readonly reserveCredit: (
      record: ReservationRecord,
      keyId: string
    ) => Effect.Effect<{ readonly keyRemaining: number }, CreditRefused>
    /** Captures the metered charge: receipt (pending settlement), economics, fee split, refund due. */
    readonly capture: (record: CaptureRecord) => Effect.Effect<void>
    /** Nothing was served: the whole reservation is released and no money moves. */
    readonly release: (record: CaptureRecord) => Effect.Effect<void>
    /** Signs and stores the receipt as final with the given settlement facts. */
    readonly finalizeReceipt: (
      requestId: string,
      patch: Partial<Pick<ReceiptBody, "payment_ref" | "settlement" | "refund_ref">>
    ) => Effect.Effect<void>
    readonly receipt: (
      requestId: string
    ) => Effect.Effect<
      { readonly body: ReceiptBody; readonly signature: string | null; readonly final: boolean } | undefined
    >
    readonly economics: (requestId: string) => Effect.Effect<unknown | undefined>
    /** Reservations older than `afterSeconds`, oldest first (at most 100). */
    readonly staleReservations: (afterSeconds: number) => Effect.Effect<ReadonlyArray<StaleReservation>>
  }
>()("router/ledger/Ledger") {
  static readonly layer = Layer.effect(
    Ledger,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const chain = yield* Chain

      const entry = (
        requestId: string,
        account: string,
        kind: string,
        amount: number,
        ref: string | null = null
      ) =>
        amount > 0
          ? sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                VALUES (${requestId}, ${account}, ${kind}, ${amount}, ${ref})`
          : Effect.void

      /**
       * One statement, one round trip, on the first-byte path: the request, its authorization
       * and the ledger row land together or not at all. A (payer, nonce) seen before violates
       * the primary key and the whole statement fails: a replay never reserves anything.
       */
      const reserveX402 = Effect.fn("Ledger.reserveX402")(function* (
        record: ReservationRecord,
        hold: X402Hold
      ) {
        const payer = record.payer.toLowerCase()
        const insert = sql`
          WITH request AS (
            INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                  provider_id, authorized, status, agent, session_id)
            VALUES (${record.requestId}, ${record.dialect}, 'x402', ${payer}, ${record.requestedModel},
                    ${record.modelClass}, ${record.providerId}, ${record.authorized}, 'reserved',
                    ${JSON.stringify(record.agent)}::jsonb, ${record.sessionId ?? null})
            RETURNING request_id
          ), hold AS (
            INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                             signature, status)
            SELECT ${payer}, ${hold.nonce.toLowerCase()}, request_id, ${record.authorized},
                   ${hold.validAfter.toString()}, ${hold.validBefore.toString()}, ${hold.signature}, 'reserved'
            FROM request
            RETURNING request_id
          )
          INSERT INTO ledger_entries (request_id, account, kind, amount)
          SELECT request_id, ${payer}, 'authorization_reserved', ${record.authorized} FROM hold
        `
        // Per payer, serialized: the authorizations not yet settled plus this one must fit the
        // balance the chain reported (they have not moved any money yet).
        const reserve =
          hold.balance === undefined
            ? insert
            : sql.withTransaction(
                Effect.gen(function* () {
                  yield* sql`SELECT pg_advisory_xact_lock(hashtextextended(${payer}, 7403))`
                  const rows = yield* sql<{ outstanding: string }>`
                    SELECT coalesce(sum(value), 0)::text AS outstanding FROM x402_authorizations
                    WHERE payer = ${payer} AND status IN ('reserved', 'pending', 'submitted')
                  `
                  if (BigInt(rows[0]?.outstanding ?? "0") + BigInt(record.authorized) > hold.balance!) {
                    return yield* new NonceReplay({ payer, reason: "overcommitted" })
                  }
                  return yield* insert
                })
              )
        yield* reserve.pipe(
          Effect.catchTag("SqlError", (error) =>
            isUniqueViolation(error)
              ? Effect.fail(new NonceReplay({ payer, reason: "nonce_replay" }))
              : Effect.die(error)
          )
        )
      })

      const nonceUnused = (payer: string, nonce: Hex) =>
        sql<{ n: number }>`
          SELECT count(*)::int AS n FROM x402_authorizations
          WHERE payer = ${payer.toLowerCase()} AND nonce = ${nonce.toLowerCase()}
        `.pipe(
          Effect.map((rows) => rows[0]?.n === 0),
          Effect.orDie
        )

      const storeReceipt = (receipt: ReceiptBody, economics: unknown) =>
        Effect.all([
          sql`INSERT INTO receipts (request_id, epoch_id, body) VALUES (${receipt.request_id}, ${receipt.epoch_id},
                ${JSON.stringify(receipt)}::jsonb)`,
          sql`INSERT INTO economics (request_id, body) VALUES (${receipt.request_id}, ${JSON.stringify(economics)}::jsonb)`
        ])

      const sign = (receipt: ReceiptBody) => chain.signTypedData(receiptTypedData(receipt, chain.chainId))

      /** A funded key's reservation goes back: the cap and the owner's balance, less what was spent. */
      const settleCredit = (receipt: ReceiptBody, keyId: string) =>
        Effect.gen(function* () {
          yield* sql`
            UPDATE api_keys SET reserved = reserved - ${receipt.authorized}, spent = spent + ${receipt.charged}
            WHERE key_id = ${keyId}
          `
          yield* sql`
            UPDATE wallet_balances
            SET reserved = reserved - ${receipt.authorized},
                available = available + ${receipt.authorized - receipt.charged}, updated_at = now()
            WHERE wallet = ${receipt.wallet}
          `
          yield* entry(
            receipt.request_id,
            receipt.wallet,
            "credit_released",
            receipt.authorized - receipt.charged
          )
        })

      /** A served turn (or the opening call) is spent from its session and lets the session go. */
      const spendSession = (receipt: ReceiptBody, sessionId: string, prefixTokens: number) =>
        sql`
          UPDATE sessions SET spent = spent + ${receipt.charged}, in_flight = NULL, turns = turns + 1,
                              prefix_tokens = ${prefixTokens}
          WHERE session_id = ${sessionId} AND in_flight = ${receipt.request_id}
        `

      /** Whether the receipt is final as captured (balance- or budget-backed) or waits for a transfer. */
      const settledOnCapture = (source: PaymentSource) =>
        source._tag === "Credit" ||
        source._tag === "SessionTurn" ||
        (source._tag === "SessionOpening" && source.funding._tag === "Credit")

      const capture = Effect.fn("Ledger.capture")(function* ({
        receipt,
        economics,
        source = X402Source
      }: CaptureRecord) {
        const { routerFee, providerShare } = feeSplit(receipt.charged)
        const refund = receipt.authorized - receipt.charged
        const signature = settledOnCapture(source) ? yield* Effect.orDie(sign(receipt)) : null
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const claimed = yield* sql`
                UPDATE requests SET charged = ${receipt.charged}, status = 'captured', finished_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
                RETURNING request_id
              `
              // Settled already (a retried capture whose first commit went through): nothing to do.
              if (claimed.length === 0) return
              yield* entry(receipt.request_id, receipt.wallet, "capture", receipt.charged)
              yield* entry(receipt.request_id, "router", "router_fee", routerFee)
              yield* entry(
                receipt.request_id,
                `provider:${receipt.provider_id}`,
                "provider_share",
                providerShare
              )
              const submitAuthorization = sql`
                UPDATE x402_authorizations SET status = 'pending', updated_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
              `
              switch (source._tag) {
                case "Credit":
                  yield* settleCredit(receipt, source.keyId)
                  break
                case "SessionOpening":
                  // The remainder stays in the session budget until the session closes.
                  if (source.funding._tag === "X402") yield* submitAuthorization
                  yield* spendSession(receipt, source.sessionId, source.prefixTokens)
                  break
                case "SessionTurn":
                  yield* spendSession(receipt, source.sessionId, source.prefixTokens)
                  break
                case "X402":
                  yield* submitAuthorization
                  if (refund > 0) {
                    yield* entry(receipt.request_id, receipt.wallet, "refund_due", refund)
                    yield* sql`
                      INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
                      VALUES (${receipt.request_id}, ${receipt.wallet}, ${refund}, ${receipt.epoch_id}, 'due')
                    `
                  }
              }
              yield* storeReceipt(receipt, economics)
              if (signature !== null) {
                yield* sql`UPDATE receipts SET signature = ${signature}, final = true WHERE request_id = ${receipt.request_id}`
              }
            })
          )
          .pipe(Effect.orDie)
      })

      /**
       * A session turn takes no money of its own: it holds its session (one turn at a time) and
       * records the request with its worst case drawn on the session's budget.
       */
      const reserveSessionTurn = Effect.fn("Ledger.reserveSessionTurn")(function* (
        record: ReservationRecord
      ) {
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
        `.pipe(Effect.orDie)
      })

      const release = Effect.fn("Ledger.release")(function* ({
        receipt,
        economics,
        source = X402Source
      }: CaptureRecord) {
        const signature = yield* Effect.orDie(sign(receipt))
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const claimed = yield* sql`
                UPDATE requests SET charged = 0, status = 'released', finished_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
                RETURNING request_id
              `
              if (claimed.length === 0) return
              const releaseAuthorization = Effect.gen(function* () {
                // The authorization is never submitted; its signature is erased.
                yield* sql`
                  UPDATE x402_authorizations SET status = 'released', signature = NULL, updated_at = now()
                  WHERE request_id = ${receipt.request_id} AND status = 'reserved'
                `
                yield* entry(receipt.request_id, receipt.wallet, "authorization_released", receipt.authorized)
              })
              switch (source._tag) {
                case "Credit":
                  yield* settleCredit(receipt, source.keyId)
                  break
                case "X402":
                  yield* releaseAuthorization
                  break
                case "SessionOpening":
                  // Nothing was served: the session never opened and its funding goes back whole.
                  if (source.funding._tag === "Credit") yield* settleCredit(receipt, source.funding.keyId)
                  else yield* releaseAuthorization
                  yield* sql`DELETE FROM sessions WHERE session_id = ${source.sessionId} AND turns = 0`
                  break
                case "SessionTurn":
                  yield* sql`UPDATE sessions SET in_flight = NULL
                             WHERE session_id = ${source.sessionId} AND in_flight = ${receipt.request_id}`
                  yield* entry(receipt.request_id, receipt.wallet, "session_released", receipt.authorized)
              }
              yield* storeReceipt(receipt, economics)
              yield* sql`UPDATE receipts SET signature = ${signature}, final = true WHERE request_id = ${receipt.request_id}`
            })
          )
          .pipe(Effect.orDie)
      })

      /**
       * One statement: the key's cap, the owner's balance, the request row and the ledger row.
       * Over the cap or the balance, a CHECK constraint fails and nothing is written; an owner
       * with no balance row trips the division guard. Any number of router instances share it.
       */
      const reserveCredit = Effect.fn("Ledger.reserveCredit")(function* (
        record: ReservationRecord,
        keyId: string
      ) {
        const rows = yield* sql<{ remaining: string; guard: number }>`
          WITH k AS (
            UPDATE api_keys SET reserved = reserved + ${record.authorized}, requests = requests + 1
            WHERE key_id = ${keyId} AND revoked_at IS NULL
            RETURNING wallet, budget - spent - reserved AS remaining
          ), w AS (
            UPDATE wallet_balances
            SET available = available - ${record.authorized}, reserved = reserved + ${record.authorized},
                updated_at = now()
            WHERE wallet = (SELECT wallet FROM k)
            RETURNING wallet
          ), request AS (
            INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                  provider_id, authorized, status, agent, key_id, session_id)
            SELECT ${record.requestId}, ${record.dialect}, 'credit', w.wallet, ${record.requestedModel},
                   ${record.modelClass}, ${record.providerId}, ${record.authorized}, 'reserved',
                   ${JSON.stringify(record.agent)}::jsonb, ${keyId}, ${record.sessionId ?? null}
            FROM w
            RETURNING request_id, payer
          ), entry AS (
            INSERT INTO ledger_entries (request_id, account, kind, amount)
            SELECT request_id, payer, 'credit_reserved', ${record.authorized} FROM request
          )
          SELECT (SELECT remaining FROM k)::text AS remaining, 1 / (SELECT count(*)::int FROM w) AS guard
        `.pipe(
          Effect.catchTag("SqlError", (error) =>
            Effect.fail(
              new CreditRefused({
                code: /api_keys/.test(String(error.reason.cause)) ? "key_budget_exhausted" : "key_unfunded"
              })
            )
          )
        )
        return { keyRemaining: Number(rows[0]?.remaining ?? 0) }
      })

      const readReceipt = (requestId: string) =>
        sql<{ body: unknown; signature: string | null; final: boolean }>`
          SELECT body, signature, final FROM receipts WHERE request_id = ${requestId}
        `.pipe(
          Effect.flatMap((rows) =>
            rows[0] === undefined
              ? Effect.succeed(undefined)
              : Effect.map(decodeReceipt(rows[0].body), (body) => ({
                  body,
                  signature: rows[0]!.signature,
                  final: rows[0]!.final
                }))
          ),
          Effect.orDie
        )

      const finalizeReceipt = Effect.fn("Ledger.finalizeReceipt")(function* (
        requestId: string,
        patch: Partial<Pick<ReceiptBody, "payment_ref" | "settlement" | "refund_ref">>
      ) {
        const current = yield* readReceipt(requestId)
        if (current === undefined) return
        const body: ReceiptBody = { ...current.body, ...patch }
        const signature = yield* Effect.orDie(sign(body))
        yield* sql`
          UPDATE receipts SET body = ${JSON.stringify(body)}::jsonb, signature = ${signature}, final = true,
                 updated_at = now()
          WHERE request_id = ${requestId}
        `.pipe(Effect.orDie)
      })

      const economics = (requestId: string) =>
        sql<{ body: unknown }>`SELECT body FROM economics WHERE request_id = ${requestId}`.pipe(
          Effect.map((rows) => rows[0]?.body),
          Effect.orDie
        )

      const staleReservations = (afterSeconds: number) =>
        sql`
          SELECT r.request_id, r.payment_kind, r.payer, r.authorized::text, r.key_id, r.session_id,
                 EXISTS (SELECT 1 FROM sessions s WHERE s.funding_request_id = r.request_id) AS opens_session,
                 r.model_class, r.provider_id, (extract(epoch from r.created_at) * 1000)::float8 AS created_at
          FROM requests r
          WHERE r.status = 'reserved' AND r.created_at < now() - make_interval(secs => ${afterSeconds})
          ORDER BY r.created_at LIMIT 100
        `.pipe(Effect.flatMap(decodeStale), Effect.orDie)

      return Ledger.of({
        staleReservations,
        reserveX402,
        reserveCredit,
        reserveSessionTurn,
        nonceUnused,
        capture,
        release,
        finalizeReceipt,
        receipt: readReceipt,
        economics
      })
    })
  )
}
