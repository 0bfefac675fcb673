import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type SqlError, type Statement } from "effect/sql"
import { Chain } from "../chain/Chain.ts"
import type { LeftByDead } from "../db/Instances.ts"
import type { ServiceUnavailable } from "../domain/Errors.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import type { LeaseRequest } from "../market/QuoteBook.ts"
import { type CaptureRecord, makeCapture, queuesCredit } from "./Capture.ts"
import { makeCreditFold } from "./CreditFold.ts"
import { makeKeyReserveBatch } from "./KeyReserveBatch.ts"
import { MeterRecord, makeMeterStore } from "./Metered.ts"
import { makeReceiptStore } from "./ReceiptStore.ts"
import {
  type CreditRefused,
  type CreditReserved,
  type KeyRefused,
  makeReservations,
  type NonceReplay,
  type ReservationRecord,
  type X402Hold,
  type X402Reserved
} from "./Reserve.ts"
import { makeSessionClose } from "./SessionClose.ts"

export type { CaptureRecord, PaymentSource } from "./Capture.ts"
export {
  CreditRefused,
  type CreditReserved,
  KeyRefused,
  NonceReplay,
  OVERCOMMITTED,
  permit2NonceOf,
  type ReservationRecord,
  type UptoNonceKey,
  uptoNonceKey,
  type X402Hold,
  type X402Reserved
} from "./Reserve.ts"

/** A reservation still open: what the reaper needs to settle it from its durable record. */
export const StaleReservation = Schema.Struct({
  request_id: Schema.String,
  payment_kind: Schema.Literals(["x402", "credit", "session"]),
  /** An x402 authorization's scheme (`upto` settles the charge itself); null for keys and sessions. */
  scheme: Schema.NullOr(Schema.Literals(["exact", "upto"])),
  /** Unix seconds after which an x402 authorization can no longer be settled; null for keys and sessions. */
  valid_before: Schema.NullOr(Schema.String),
  payer: Schema.String,
  authorized: Schema.NumberFromString,
  key_id: Schema.NullOr(Schema.String),
  session_id: Schema.NullOr(Schema.String),
  opens_session: Schema.Boolean,
  model_class: Schema.String,
  provider_id: Schema.String,
  created_at: Schema.Number,
  /** What it delivered, as last recorded (null: nothing was, or it died before its first write). */
  metered: Schema.NullOr(MeterRecord)
})
export type StaleReservation = typeof StaleReservation.Type
const decodeStale = Schema.decodeUnknownEffect(Schema.Array(StaleReservation))

/**
 * The book of record for paid requests. Every movement of money is an append-only
 * `ledger_entries` row written in the same transaction as the state it changes.
 */
export class Ledger extends Context.Service<
  Ledger,
  {
    /**
     * Reserves an x402 authorization for a request; a nonce seen before fails `NonceReplay`. Every
     * reservation fails `ServiceUnavailable` (`database_unavailable`, a 503) when the database does.
     */
    readonly reserveX402: (
      record: ReservationRecord,
      hold: X402Hold
    ) => Effect.Effect<X402Reserved, NonceReplay | ServiceUnavailable>
    /**
     * Takes back an x402 reservation made before the chain's answer, which then refused the payment (D543):
     * the request, its authorization, its ledger row and its lease, as if never made.
     */
    readonly withdrawX402: (
      requestId: string,
      payer: string,
      lease: LeaseRequest | undefined
    ) => Effect.Effect<void>
    readonly reserveSessionTurn: (record: ReservationRecord) => Effect.Effect<void, ServiceUnavailable>
    /**
     * Reserves the worst case from a funded key's owner balance within the key's cap, in one
     * statement. Returns what the key may still spend after this reservation.
     */
    readonly reserveCredit: (
      record: ReservationRecord,
      keyId: string
    ) => Effect.Effect<CreditReserved, KeyRefused | CreditRefused | ServiceUnavailable>
    /**
     * The same for a key as sent: found by its secret's hash, checked (live, unexpired at `nowMs`, able to
     * spend, owner invited) and reserved on in one statement; a key failing a check fails `KeyRefused`.
     */
    readonly reserveCreditKey: (
      record: Omit<ReservationRecord, "payer">,
      keyHash: string,
      nowMs: number
    ) => Effect.Effect<CreditReserved, KeyRefused | CreditRefused | ServiceUnavailable>
    /**
     * Captures the metered charge: receipt (pending settlement), economics, fee split, refund due. True when
     * this call settled the request (false: it was settled already).
     */
    readonly capture: (record: CaptureRecord) => Effect.Effect<boolean>
    /** Nothing was served: the whole reservation is released and no money moves. True as for `capture`. */
    readonly release: (record: CaptureRecord) => Effect.Effect<boolean>
    /**
     * Folds every credit capture made before the call into its key's and owner's rows (D315; a background
     * pass does it every 50 ms): for a writer that needs the rows themselves current (a withdrawal's debit).
     */
    readonly foldCredit: Effect.Effect<number>
    /** Records what a request still `reserved` has delivered so far (`Metered.ts`): one statement. */
    readonly recordMeter: (requestId: string, record: MeterRecord) => Effect.Effect<void, SqlError.SqlError>
    /**
     * Queues receipts already stored with their final settlement facts, unsigned, for the background
     * signer (one statement signs every receipt queued in a pass; `recordLanded` stores them, D492).
     */
    readonly signLater: (receipts: ReadonlyArray<ReceiptBody>) => Effect.Effect<void>
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
    /** Whether the request is still `reserved` (being served, or its settlement not yet committed). */
    readonly reserved: (requestId: string) => Effect.Effect<boolean>
    /**
     * Closes an open session with nothing in flight (only an expired one with `onlyExpired`) and settles
     * its remainder in one transaction: a key-funded budget returns to the key and the owner's balance
     * (through the credit fold, D402), an x402-funded one becomes a refund due in `epochId`. False when
     * there was nothing to close.
     */
    readonly closeSession: (
      sessionId: string,
      onlyExpired: boolean,
      epochId: number
    ) => Effect.Effect<boolean>
    /** Reservations older than `afterSeconds`, oldest first (at most 100). */
    readonly staleReservations: (afterSeconds: number) => Effect.Effect<ReadonlyArray<StaleReservation>>
    /**
     * Reservations still open that the given (dead) router instances left: those `leftByDead`
     * (`Instances.leftByDead`) holds for, by their creation time (D563).
     */
    readonly reservationsOf: (
      instanceIds: ReadonlyArray<string>,
      leftByDead: LeftByDead
    ) => Effect.Effect<ReadonlyArray<StaleReservation>>
    /** An instance's reservations still open with a final meter on record: settlements it could not write. */
    readonly finalRecordsOf: (instanceId: string) => Effect.Effect<ReadonlyArray<StaleReservation>>
  }
>()("router/ledger/Ledger") {
  static readonly layer = Layer.effect(
    Ledger,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const chain = yield* Chain
      const receipts = yield* makeReceiptStore(sql, chain)
      const { reserveCreditKeys, ...reservations } = makeReservations(sql)
      // A key's reservations of one turn share a statement (D545).
      const keyReservations = yield* makeKeyReserveBatch({
        reserveCreditKeys,
        reserveCreditKey: reservations.reserveCreditKey
      })
      const fold = makeCreditFold(sql)
      yield* fold.start
      // Made after the fold and the receipt signer: at shutdown its open batches are sent before their last passes.
      const settled = yield* makeCapture(sql, receipts)
      /** A settlement that queued a credit capture for the fold (D315) wakes the fold's passes. */
      const waking =
        (
          settle: (record: CaptureRecord) => Effect.Effect<boolean>,
          queues: (record: CaptureRecord) => boolean
        ) =>
        (record: CaptureRecord): Effect.Effect<boolean> =>
          settle(record).pipe(
            Effect.tap((claimed) =>
              Effect.sync(() => {
                if (claimed && queues(record)) fold.queued()
              })
            )
          )
      // A capture queues only a key's own request (a session's opening keeps its budget until the close);
      // a release also gives back a key-funded session opening.
      const capture = waking(settled.capture, (record) => record.source?._tag === "Credit")
      const release = waking(settled.release, (record) => queuesCredit(record.source))

      /** What settling an open reservation from its durable record reads. */
      const openColumns = sql`
        SELECT r.request_id, r.payment_kind, r.payer, r.authorized::text, r.key_id, r.session_id,
               a.scheme, a.valid_before::text AS valid_before,
               EXISTS (SELECT 1 FROM sessions s WHERE s.funding_request_id = r.request_id) AS opens_session,
               r.model_class, r.provider_id, (extract(epoch from r.created_at) * 1000)::float8 AS created_at,
               r.metered
      `

      /** Open reservations matching `where`, oldest first, 100 at a time, with their durable records. */
      const openWhere = (where: Statement.Fragment) =>
        sql`
          ${openColumns}
          FROM requests r
          LEFT JOIN LATERAL (
            SELECT scheme, valid_before FROM x402_authorizations WHERE request_id = r.request_id LIMIT 1
          ) a ON true
          WHERE r.status = 'reserved' AND ${where}
          ORDER BY r.created_at LIMIT 100
        `.pipe(Effect.flatMap(decodeStale), Effect.orDie)

      const staleReservations = (afterSeconds: number) =>
        openWhere(sql`r.created_at < now() - make_interval(secs => ${afterSeconds})`)

      const reservationsOf = (instanceIds: ReadonlyArray<string>, leftByDead: LeftByDead) =>
        openWhere(
          sql`r.instance_id IN ${sql.in(instanceIds)}
            AND EXISTS (SELECT 1 FROM router_instances WHERE ${leftByDead(sql`r.instance_id`, sql`r.created_at`)})`
        )

      const finalRecordsOf = (instanceId: string) =>
        openWhere(sql`r.instance_id = ${instanceId} AND (r.metered->>'final')::boolean`)

      return Ledger.of({
        ...reservations,
        reserveCreditKey: keyReservations.reserve,
        capture,
        release,
        foldCredit: fold.foldNow,
        ...makeMeterStore(sql),
        signLater: (bodies) => Effect.forEach(bodies, receipts.enqueue, { discard: true }),
        finalizeReceipt: receipts.finalize,
        receipt: receipts.read,
        economics: receipts.economics,
        reserved: (requestId) =>
          sql<{ reserved: boolean }>`
            SELECT true AS reserved FROM requests WHERE request_id = ${requestId} AND status = 'reserved'`.pipe(
            Effect.map((rows) => rows.length > 0),
            Effect.orDie
          ),
        closeSession: makeSessionClose(sql, fold.queued),
        staleReservations,
        reservationsOf,
        finalRecordsOf
      })
    })
  )
}
