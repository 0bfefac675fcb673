import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { Hex } from "viem"
import { Chain } from "../chain/Chain.ts"
import type { EconomicsRecord } from "../domain/Economics.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import { makeCapture } from "./Capture.ts"
import { makeReceiptStore } from "./ReceiptStore.ts"
import { makeReservations } from "./Reserve.ts"
import { makeSessionClose } from "./SessionClose.ts"

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
  readonly economics: EconomicsRecord
  /** Defaults to an x402 authorization. */
  readonly source?: PaymentSource | undefined
}

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
    /**
     * Closes an open session with nothing in flight (only an expired one with `onlyExpired`) and settles
     * its remainder in one transaction: a key-funded budget returns to the key and the owner's balance,
     * an x402-funded one becomes a refund due in `epochId`. False when there was nothing to close.
     */
    readonly closeSession: (
      sessionId: string,
      onlyExpired: boolean,
      epochId: number
    ) => Effect.Effect<boolean>
    /** Reservations older than `afterSeconds`, oldest first (at most 100). */
    readonly staleReservations: (afterSeconds: number) => Effect.Effect<ReadonlyArray<StaleReservation>>
  }
>()("router/ledger/Ledger") {
  static readonly layer = Layer.effect(
    Ledger,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const chain = yield* Chain
      const receipts = makeReceiptStore(sql, chain)
      const reservations = makeReservations(sql)
      const { capture, release } = makeCapture(sql, receipts)

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
        ...reservations,
        capture,
        release,
        finalizeReceipt: receipts.finalize,
        receipt: receipts.read,
        economics: receipts.economics,
        closeSession: makeSessionClose(sql),
        staleReservations
      })
    })
  )
}
