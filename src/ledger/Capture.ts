import { Config, Effect } from "effect"
import type { SqlClient, Statement } from "effect/sql"
import { feeSplit } from "../domain/Billing.ts"
import type { EconomicsRecord } from "../domain/Economics.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import type { ReceiptStore } from "./ReceiptStore.ts"
import { type Entry, makeSettleBatch, type Settlement } from "./SettleBatch.ts"

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
  /** The capacity lease the request held while served: the statement deletes it (whether or not it claims). */
  readonly lease?: string | undefined
  /**
   * The caller has its reply already and nothing waits for this settlement (D534): a key's or an `exact`
   * authorization's that holds no lease row may wait up to `SETTLE_LINGER_MS` for more of its wallet's (D573).
   */
  readonly linger?: boolean | undefined
}

/** What the settling statement stores besides the record: the receipt's signature when it is final as stored. */
interface Signed {
  readonly signature: string | null
}

const X402Source: PaymentSource = { _tag: "X402" }

/**
 * How long a settlement whose caller has its reply may wait for more of its wallet's (D573); 0: none. At most 1 s:
 * the settlement's inline bound (2 s, `Settle.ts`) must not run out while it waits.
 */
const settleLingerMs = Config.Int("SETTLE_LINGER_MS").pipe(
  Config.withDefault(20),
  Config.map((ms) => Math.min(1_000, Math.max(0, ms)))
)

/** Whether settling a request paid this way may queue a credit capture for the fold (D315). */
export const queuesCredit = (source: PaymentSource | undefined): boolean =>
  source?._tag === "Credit" || (source?._tag === "SessionOpening" && source.funding._tag === "Credit")

/**
 * One more write of the settling statement: its CTE's name (another write may wait for it) and text, and
 * whether it moves the payer's `x402_outstanding` sum (an authorization's trigger then writes that row).
 */
type Effect_ = readonly [name: string, statement: Statement.Fragment, movesOutstanding?: boolean]

/** How a request paid by a key or an `exact` authorization is settled in a batch (`SettleBatch.ts`). */
type Together = Partial<Pick<Settlement, "credit_queued" | "authorization_status" | "refund">>

/**
 * Capture and release: how a reservation ends. Either is idempotent (only a request still `reserved`
 * is settled), writes the receipt and economics, and moves the money by the way it was paid, in one
 * statement: atomic, every write gated on the claim of the request. A request paid by a funded key or an
 * `exact` authorization is settled with the others of its wallet ready in the same turn, one statement for
 * all (`SettleBatch.ts`, D370); the other ways of paying have a statement of their own. Either answers
 * whether this call claimed the request. A receipt final as settled (a balance's or a budget's charge, a
 * release) is signed before the statement and stored signed, one write of its row (D495); one still
 * waiting for a transfer is stored unsigned and signed when its settlement lands.
 */
export const makeCapture = Effect.fnUntraced(function* (sql: SqlClient.SqlClient, receipts: ReceiptStore) {
  const batch = yield* makeSettleBatch(sql, yield* settleLingerMs)

  /**
   * Whether the receipt is final as captured (balance- or budget-backed, or an `upto` authorization charged
   * zero, which settles nothing) or waits for a transfer.
   */
  const settledOnCapture = (source: PaymentSource, receipt: ReceiptBody) =>
    (source._tag === "X402" && source.scheme === "upto" && receipt.charged === 0) ||
    source._tag === "Credit" ||
    source._tag === "SessionTurn" ||
    (source._tag === "SessionOpening" && source.funding._tag === "Credit")

  /**
   * One statement: `claimed` takes the request from `reserved` to `status` (no row: settled already,
   * and every other write, gated on `claimed`, does nothing); the ledger rows, the receipt and the
   * economics are inserted, and the payment's own writes (`effects`) run. When an effect moves the payer's
   * outstanding sum, `outstanding_locked` locks the payer's row first and the effect and the receipt wait for
   * it: the payer's row before the points rows the receipt's trigger writes, as a landing takes them (D513),
   * whatever order Postgres runs the CTEs in (D519).
   */
  const settleStatement = (
    record: CaptureRecord & Signed,
    status: "captured" | "released",
    entries: ReadonlyArray<Entry>,
    effects: ReadonlyArray<Effect_>
  ) => {
    const { receipt, economics } = record
    const rows = entries.filter((e) => e.amount > 0)
    const locksOutstanding = effects.some(([, , moves]) => moves === true)
    const ctes = [
      sql`claimed AS (
        UPDATE requests SET charged = ${receipt.charged}, status = ${status}, epoch_id = ${receipt.epoch_id},
                            finished_at = now()
        WHERE request_id = ${receipt.request_id} AND status = 'reserved'
        RETURNING request_id, key_id, payer, authorized
      )`,
      ...(locksOutstanding
        ? [
            sql`outstanding_locked AS (
              SELECT count(*) FROM (
                SELECT 1 FROM x402_outstanding
                WHERE payer IN (SELECT payer FROM claimed)
                FOR UPDATE
              ) l
            )`
          ]
        : []),
      sql`receipt AS (
        INSERT INTO receipts (request_id, epoch_id, body, signature, final)
        SELECT request_id, ${receipt.epoch_id}, ${JSON.stringify(receipt)}::jsonb, ${record.signature},
               ${record.signature !== null} FROM claimed
        ${locksOutstanding ? sql`WHERE ${outstandingFirst}` : sql``}
      )`,
      sql`economics AS (
        INSERT INTO economics (request_id, body) SELECT request_id, ${JSON.stringify(economics)}::jsonb FROM claimed
      )`,
      ...(rows.length === 0
        ? []
        : [
            sql`entries AS (
              INSERT INTO ledger_entries (request_id, account, kind, amount)
              SELECT claimed.request_id, e.account, e.kind, e.amount
              FROM claimed, jsonb_to_recordset(${JSON.stringify(rows)}::jsonb)
                   AS e(account text, kind text, amount bigint)
            )`
          ]),
      ...effects.map(([name, effect]) => sql`${sql.literal(name)} AS (${effect})`)
    ]
    // The lease ends in the one row the count always gives, once `claimed` is read whole: after the claim,
    // whether or not it claimed (D553).
    const leaseReleased =
      record.lease === undefined
        ? sql``
        : sql`, capacity_release(ARRAY[${record.lease}]::text[]) AS leases_released`
    return sql<{ claimed: number }>`
      WITH ${sql.join(", ", false)(ctes)}
      SELECT count(*)::int AS claimed${leaseReleased} FROM claimed
    `.pipe(Effect.map((result) => (result[0]?.claimed ?? 0) > 0))
  }

  /** The settlement as one row of its wallet's batch of this turn (`SettleBatch.ts`). */
  const settleTogether = (
    { receipt, economics, lease, signature, linger }: CaptureRecord & Signed,
    status: "captured" | "released",
    entries: ReadonlyArray<Entry>,
    together: Together
  ) =>
    batch.settle(
      {
        request_id: receipt.request_id,
        status,
        charged: receipt.charged,
        epoch_id: receipt.epoch_id,
        receipt,
        signature,
        economics,
        entries: entries.filter((e) => e.amount > 0),
        lease: lease ?? null,
        credit_queued: together.credit_queued ?? false,
        authorization_status: together.authorization_status ?? null,
        refund: together.refund ?? 0
      },
      linger === true && lease === undefined
    )

  /**
   * Settles in the batch with `together`, else in a statement of its own. A receipt `final` as settled is
   * signed first and stored signed (D495); one that could not be signed is stored unsigned and queued.
   */
  const settle = Effect.fnUntraced(function* (
    record: CaptureRecord,
    status: "captured" | "released",
    entries: ReadonlyArray<Entry>,
    effects: ReadonlyArray<Effect_>,
    together: Together | undefined,
    final: boolean
  ) {
    const signed = { ...record, signature: final ? yield* receipts.signFinal(record.receipt) : null }
    const claimed = yield* (
      together === undefined
        ? settleStatement(signed, status, entries, effects)
        : settleTogether(signed, status, entries, together)
    ).pipe(Effect.orDie)
    if (claimed && final && signed.signature === null) yield* receipts.enqueue(record.receipt)
    return claimed
  })

  const claimedOnly = sql`EXISTS (SELECT 1 FROM claimed)`
  /** A write that waits for the payer's `x402_outstanding` row (`outstanding_locked`). */
  const outstandingFirst = sql`(SELECT * FROM outstanding_locked) >= 0`
  /**
   * An effect that moves the payer's outstanding sum: its write is given the gate that waits for the payer's
   * row, and the effect says it moves the sum, so the statement locks that row first (D519). The two come
   * together here: a write gated on `outstanding_locked` in a statement without it would not run at all.
   */
  const movingOutstanding = (
    name: string,
    write: (payerFirst: Statement.Fragment) => Statement.Fragment
  ): Effect_ => [name, write(outstandingFirst), true]

  /**
   * A funded key's reservation goes back: the cap and the owner's balance, less what was spent. Not here:
   * the request joins `credit_unfolded`, and the fold pass (`CreditFold.ts`, D315) applies many captures
   * to the key's and the owner's rows in one statement, so a key's requests lock those rows once each (at
   * reservation), not twice. Until folded the whole worst case stays reserved.
   */
  const creditReleased = (receipt: ReceiptBody): Entry => ({
    account: receipt.wallet,
    kind: "credit_released",
    amount: receipt.authorized - receipt.charged
  })

  /** The same in a statement of its own (a key-funded session opening's release). */
  const settleCredit = (receipt: ReceiptBody) => ({
    entries: [creditReleased(receipt)],
    effects: [
      [
        "credit_queued",
        sql`INSERT INTO credit_unfolded (request_id, key_id, wallet, authorized, charged)
            SELECT request_id, key_id, payer, authorized, ${receipt.charged} FROM claimed`
      ]
    ] satisfies ReadonlyArray<Effect_>
  })

  /** A served turn (or the opening call) is spent from its session and lets the session go. */
  const spendSession = (receipt: ReceiptBody, sessionId: string, prefixTokens: number) =>
    sql`UPDATE sessions SET spent = spent + ${receipt.charged}, in_flight = NULL, turns = turns + 1,
                            prefix_tokens = ${prefixTokens}
        WHERE session_id = ${sessionId} AND in_flight = ${receipt.request_id} AND ${claimedOnly}`

  /** An authorization never submitted goes back whole. */
  const authorizationReleased = (receipt: ReceiptBody): Entry => ({
    account: receipt.wallet,
    kind: "authorization_released",
    amount: receipt.authorized
  })

  const submitAuthorization = (receipt: ReceiptBody) =>
    sql`UPDATE x402_authorizations SET status = 'pending', updated_at = now()
        WHERE request_id = ${receipt.request_id} AND status = 'reserved' AND ${claimedOnly}`

  /**
   * An `upto` authorization is settled at the charge itself: the proxy moves exactly that much, so the
   * queue's `value` becomes the charge and nothing is refunded; the unused ceiling is never taken. A zero
   * charge settles nothing: the authorization is released unsubmitted (its signature erased).
   */
  const settleUpto = (receipt: ReceiptBody) => ({
    entries: [
      {
        account: receipt.wallet,
        kind: "authorization_released",
        amount: receipt.authorized - receipt.charged
      }
    ],
    effects: [
      movingOutstanding("authorization_settled", (payerFirst) =>
        receipt.charged > 0
          ? sql`UPDATE x402_authorizations SET status = 'pending', value = ${receipt.charged}, updated_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved' AND ${claimedOnly}
                  AND ${payerFirst}`
          : sql`UPDATE x402_authorizations SET status = 'released', signature = NULL, updated_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved' AND ${claimedOnly}
                  AND ${payerFirst}`
      )
    ] satisfies Array<Effect_>
  })

  const capture = Effect.fnUntraced(function* ({
    receipt,
    economics,
    source = X402Source,
    lease,
    linger
  }: CaptureRecord) {
    const { routerFee, providerShare } = feeSplit(receipt.charged)
    const refund = receipt.authorized - receipt.charged
    const entries: Array<Entry> = [
      { account: receipt.wallet, kind: "capture", amount: receipt.charged },
      { account: "router", kind: "router_fee", amount: routerFee },
      { account: `provider:${receipt.provider_id}`, kind: "provider_share", amount: providerShare }
    ]
    const effects: Array<Effect_> = []
    let together: Together | undefined
    switch (source._tag) {
      case "Credit":
        entries.push(creditReleased(receipt))
        together = { credit_queued: true }
        break
      case "SessionOpening":
        // The remainder stays in the session budget until the session closes.
        if (source.funding._tag === "X402")
          effects.push(["authorization_settled", submitAuthorization(receipt)])
        effects.push(["session_settled", spendSession(receipt, source.sessionId, source.prefixTokens)])
        break
      case "SessionTurn":
        effects.push(["session_settled", spendSession(receipt, source.sessionId, source.prefixTokens)])
        break
      case "X402":
        if (source.scheme === "upto") {
          const upto = settleUpto(receipt)
          entries.push(...upto.entries)
          effects.push(...upto.effects)
          break
        }
        entries.push({ account: receipt.wallet, kind: "refund_due", amount: refund })
        together = { authorization_status: "pending", refund }
    }
    // A charge settled on a balance or a budget is final now; one paid by a transfer waits for it.
    return yield* settle(
      { receipt, economics, lease, linger },
      "captured",
      entries,
      effects,
      together,
      settledOnCapture(source, receipt)
    )
  })

  const release = Effect.fnUntraced(function* ({
    receipt,
    economics,
    source = X402Source,
    lease
  }: CaptureRecord) {
    const entries: Array<Entry> = []
    const effects: Array<Effect_> = []
    const releaseAuthorization = () => {
      // The authorization is never submitted; its signature is erased.
      effects.push(
        movingOutstanding(
          "authorization_settled",
          (payerFirst) => sql`
            UPDATE x402_authorizations SET status = 'released', signature = NULL, updated_at = now()
            WHERE request_id = ${receipt.request_id} AND status = 'reserved' AND ${claimedOnly} AND ${payerFirst}
          `
        )
      )
      entries.push(authorizationReleased(receipt))
    }
    const releaseCredit = () => {
      const credit = settleCredit(receipt)
      entries.push(...credit.entries)
      effects.push(...credit.effects)
    }
    let together: Together | undefined
    switch (source._tag) {
      case "Credit":
        entries.push(creditReleased(receipt))
        together = { credit_queued: true }
        break
      case "X402":
        entries.push(authorizationReleased(receipt))
        together = { authorization_status: "released" }
        break
      case "SessionOpening":
        // Nothing was served: the session never opened and its funding goes back whole.
        if (source.funding._tag === "Credit") releaseCredit()
        else releaseAuthorization()
        effects.push([
          "session_settled",
          sql`DELETE FROM sessions WHERE session_id = ${source.sessionId} AND turns = 0 AND ${claimedOnly}`
        ])
        break
      case "SessionTurn":
        effects.push([
          "session_settled",
          sql`UPDATE sessions SET in_flight = NULL
              WHERE session_id = ${source.sessionId} AND in_flight = ${receipt.request_id} AND ${claimedOnly}`
        ])
        entries.push({ account: receipt.wallet, kind: "session_released", amount: receipt.authorized })
    }
    // A release is final.
    return yield* settle({ receipt, economics, lease }, "released", entries, effects, together, true)
  })

  return { capture, release }
})
