import { Effect, Metric } from "effect"
import type { SqlClient, SqlError } from "effect/sql"
import type { EconomicsRecord } from "../domain/Economics.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import { makeTurnBatches } from "../process/TurnBatches.ts"

/** A ledger row a settlement writes (only for a positive amount). */
export interface Entry {
  readonly account: string
  readonly kind: string
  readonly amount: number
}

/**
 * The settlement of a request paid by a funded key or an `exact` x402 authorization (captured or released),
 * as data: every write the batched statement makes for it.
 */
export interface Settlement {
  readonly request_id: string
  readonly status: "captured" | "released"
  readonly charged: number
  readonly epoch_id: number
  readonly receipt: ReceiptBody
  /** The receipt's signature when it is final as stored (D495): the row is written once, signed. */
  readonly signature: string | null
  readonly economics: EconomicsRecord
  /** Positive amounts only. */
  readonly entries: ReadonlyArray<Entry>
  /** The capacity lease the request held: deleted whether or not the request is claimed. */
  readonly lease: string | null
  /** A key's request joins the fold's queue (D315). */
  readonly credit_queued: boolean
  /** What its x402 authorization becomes: submitted for settlement, or released unsubmitted (its signature erased). */
  readonly authorization_status: "pending" | "released" | null
  /** An `exact` authorization's refund due (authorized − charged), recorded when positive. */
  readonly refund: number
}

/** How many settlements each batched statement wrote (the count: the statements; the sum: the settlements). */
export const settleBatchSize = Metric.histogram("svc_settle_batch_size", {
  description: "Settlements per batched settling statement",
  boundaries: [1, 2, 4, 8, 16, 32, 64]
})

/** Batched settling statements that failed: each of their settlements was then written on its own. */
export const settleBatchFallbacks = Metric.counter("svc_settle_batch_fallbacks_total", {
  description: "Batched settling statements that failed; each settlement in them was then written alone",
  incremental: true
})

/**
 * Group commit of settlements (D370): the settlements of one wallet that become ready in the same turn of
 * the event loop go to Postgres as one statement over all of them, which claims each request on its own
 * (`status = 'reserved'`) and writes only for the ones it claimed. Each caller learns whether its own
 * request was claimed. A statement that fails wrote nothing (it is one transaction): each of its
 * settlements is then written alone by its caller, by the same statement over one row, failing as it
 * would have alone.
 *
 * One wallet a batch, only settlements that charge something (D420), and the receipts
 * inserted in the order of the shared rows their triggers write: a statement locks its wallet's points row
 * (every receipt in it moves the wallet's points, the first one locks the row), then provider points shards in
 * `(provider, shard)` order, then the market's rollup shards in their key's order (the receipts' statement
 * triggers, in the order of their names, at the statement's end: D546, D547), as a single settlement does with
 * one of each. So no two statements (batched or not, here or on another instance)
 * can wait on each other in a cycle.
 *
 * None of that order rests on the order Postgres runs the CTEs in, which is unspecified (D519): every write
 * reads `claimed`, so the requests' rows come first; row triggers fire at the end of the statement, after every
 * CTE's own writes; the only CTE besides `receipt` whose trigger locks a shared row is the authorization's
 * update of a release (`released` leaves the payer's `x402_outstanding` sum), and that row is locked first,
 * in payer order, by `outstanding_locked`, which both the update and the receipts' insert wait for: the
 * payer's row before any points row, as a landing takes them (D513).
 */
export const makeSettleBatch = Effect.fnUntraced(function* (sql: SqlClient.SqlClient, lingerMs = 0) {
  /** One statement over `rows` (distinct requests): the ids of the requests it claimed. */
  const settleAll = (rows: ReadonlyArray<Settlement>) =>
    sql<{ request_id: string }>`
      WITH settling AS (
        SELECT * FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS s(
          request_id text, status text, charged bigint, epoch_id bigint, receipt jsonb, signature text,
          economics jsonb, entries jsonb, lease text, credit_queued boolean, authorization_status text,
          refund bigint
        )
      ), claimed AS (
        UPDATE requests r SET charged = s.charged, status = s.status, epoch_id = s.epoch_id, finished_at = now()
        FROM settling s
        WHERE r.request_id = s.request_id AND r.status = 'reserved'
        RETURNING r.request_id, r.key_id, r.payer, r.authorized, s.charged, s.epoch_id, s.receipt, s.signature,
                  s.economics, s.entries, s.credit_queued, s.authorization_status, s.refund
      ), outstanding_locked AS (
        SELECT count(*) FROM (
          SELECT 1 FROM x402_outstanding
          WHERE payer IN (SELECT payer FROM claimed WHERE authorization_status = 'released')
          ORDER BY payer FOR UPDATE
        ) l
      ), receipt AS (
        INSERT INTO receipts (request_id, epoch_id, body, signature, final)
        SELECT request_id, epoch_id, receipt, signature, signature IS NOT NULL FROM claimed
        WHERE (SELECT * FROM outstanding_locked) >= 0
        ORDER BY receipt->>'provider_id', hashtext(request_id) & 7
      ), economics AS (
        INSERT INTO economics (request_id, body)
        SELECT request_id, economics FROM claimed
      ), entries AS (
        INSERT INTO ledger_entries (request_id, account, kind, amount)
        SELECT c.request_id, e.account, e.kind, e.amount
        FROM claimed c, jsonb_to_recordset(c.entries) AS e(account text, kind text, amount bigint)
      ), credit_queued AS (
        INSERT INTO credit_unfolded (request_id, key_id, wallet, authorized, charged)
        SELECT request_id, key_id, payer, authorized, charged FROM claimed WHERE credit_queued
      ), authorization_settled AS (
        UPDATE x402_authorizations a
        SET status = c.authorization_status, updated_at = now(),
            signature = CASE WHEN c.authorization_status = 'released' THEN NULL ELSE a.signature END
        FROM claimed c
        WHERE a.request_id = c.request_id AND a.status = 'reserved' AND c.authorization_status IS NOT NULL
          AND (SELECT * FROM outstanding_locked) >= 0
      ), refund_recorded AS (
        INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
        SELECT request_id, receipt->>'wallet', refund, epoch_id, 'due' FROM claimed WHERE refund > 0
      ), lease_released AS (
        SELECT capacity_release(ARRAY(SELECT lease FROM settling WHERE lease IS NOT NULL)) AS n
        FROM (SELECT count(*) FROM claimed) settled
      )
      SELECT request_id FROM claimed WHERE (SELECT n FROM lease_released) >= 0
    `.pipe(Effect.map((claimed) => new Set(claimed.map((row) => row.request_id))))

  const alone = (row: Settlement) => Effect.map(settleAll([row]), (claimed) => claimed.size > 0)

  /** One wallet's batch: the ids the statement claimed, or undefined when it failed (each is then written alone). */
  const sendBatch = (_wallet: string, rows: ReadonlyArray<Settlement>) =>
    Metric.update(settleBatchSize, rows.length).pipe(
      // Built inside the effect: a record that could not be encoded fails the batch (each row then goes
      // alone) instead of throwing past the answer every caller of the batch waits for.
      Effect.andThen(Effect.suspend(() => settleAll(rows))),
      Effect.matchCauseEffect({
        onSuccess: (claimed): Effect.Effect<ReadonlySet<string> | undefined> => Effect.succeed(claimed),
        onFailure: (cause) =>
          Effect.andThen(
            Effect.logWarning("batched settlement failed; each settlement is written alone", {
              settlements: rows.length,
              cause: String(cause)
            }),
            Metric.update(settleBatchFallbacks, 1)
          ).pipe(Effect.as(undefined))
      })
    )
  const batches = yield* makeTurnBatches(sendBatch)
  /**
   * The batches of settlements whose callers have their replies already (D573): each waits `lingerMs` after
   * its first settlement for more of its wallet's, so a wallet settling a call every few milliseconds shares
   * a statement (its fixed cost, the receipts' triggers and the commit's flush) among several.
   */
  const lingering = lingerMs > 0 ? yield* makeTurnBatches(sendBatch, 64, lingerMs) : batches

  /**
   * Settles `row` in its wallet's batch of this turn (with `linger`, in its wallet's lingering batch): whether
   * this call claimed the request. At shutdown what is still open is sent before the database goes, and before
   * the fold's and the receipt signer's last passes (made before this, so closed after it); later settlements
   * go alone.
   */
  const settle = (row: Settlement, linger = false): Effect.Effect<boolean, SqlError.SqlError> =>
    Effect.suspend(() => {
      const wallet = row.receipt.wallet
      // The same request twice in one open batch: the second is written after the batch, alone (and claims
      // nothing).
      for (const open of [batches.open(wallet), lingering.open(wallet)]) {
        if (open?.items.some((r) => r.request_id === row.request_id)) {
          return Effect.andThen(open.answered, alone(row))
        }
      }
      // Nothing charged (a release, or a capture of nothing) moves no points of the wallet: its receipt locks
      // a provider shard and not the wallet's row, so in a batch it could take a shard before the wallet's row
      // while another batch of the wallet holds that row and waits for the shard. It goes alone (D420).
      if (row.charged <= 0) return alone(row)
      return Effect.flatMap((linger ? lingering : batches).add(wallet, row), (batched) =>
        batched === undefined || batched.answer === undefined
          ? alone(row)
          : Effect.succeed(batched.answer.has(row.request_id))
      )
    })

  return { settle }
})
