import { Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { feeSplit } from "../domain/Billing.ts"
import type { EconomicsRecord } from "../domain/Economics.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import type { ReceiptStore } from "./ReceiptStore.ts"

/**
 * How a captured request was paid: an x402 authorization (`exact` unless said: an `upto` one settles the
 * charge itself, so it has no refund), or a funded key's reservation.
 */
export type PaymentSource =
  | { readonly _tag: "X402"; readonly scheme?: "exact" | "upto" }
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

export interface CaptureRecord {
  readonly receipt: ReceiptBody
  readonly economics: EconomicsRecord
  /** Defaults to an x402 authorization. */
  readonly source?: PaymentSource | undefined
}

const X402Source: PaymentSource = { _tag: "X402" }

/** One ledger row, only for a positive amount. */
export const ledgerEntry =
  (sql: SqlClient.SqlClient) =>
  (requestId: string, account: string, kind: string, amount: number, ref: string | null = null) =>
    amount > 0
      ? sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
            VALUES (${requestId}, ${account}, ${kind}, ${amount}, ${ref})`
      : Effect.void

/**
 * Capture and release: how a reservation ends. Either is idempotent (only a request still `reserved`
 * is settled), writes the receipt and economics, and moves the money by the way it was paid, in one
 * transaction.
 */
export const makeCapture = (sql: SqlClient.SqlClient, receipts: ReceiptStore) => {
  const entry = ledgerEntry(sql)
  const { store: storeReceipt, sign } = receipts

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

  /**
   * An `upto` authorization is settled at the charge itself: the proxy moves exactly that much, so the
   * queue's `value` becomes the charge and nothing is refunded; the unused ceiling is never taken. A zero
   * charge settles nothing: the authorization is released unsubmitted (its signature erased).
   */
  const settleUpto = (receipt: ReceiptBody) =>
    Effect.gen(function* () {
      yield* receipt.charged > 0
        ? sql`
            UPDATE x402_authorizations SET status = 'pending', value = ${receipt.charged}, updated_at = now()
            WHERE request_id = ${receipt.request_id} AND status = 'reserved'
          `
        : sql`
            UPDATE x402_authorizations SET status = 'released', signature = NULL, updated_at = now()
            WHERE request_id = ${receipt.request_id} AND status = 'reserved'
          `
      yield* entry(
        receipt.request_id,
        receipt.wallet,
        "authorization_released",
        receipt.authorized - receipt.charged
      )
    })

  /** Whether the receipt is final as captured (balance- or budget-backed) or waits for a transfer. */
  const settledOnCapture = (source: PaymentSource, receipt: ReceiptBody) =>
    (source._tag === "X402" && source.scheme === "upto" && receipt.charged === 0) ||
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
    const signature = settledOnCapture(source, receipt) ? yield* Effect.orDie(sign(receipt)) : null
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
          yield* entry(receipt.request_id, `provider:${receipt.provider_id}`, "provider_share", providerShare)
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
              if (source.scheme === "upto") {
                yield* settleUpto(receipt)
                break
              }
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

  return { capture, release }
}
