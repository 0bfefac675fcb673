import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import type { WithdrawalView } from "../domain/Credits.ts"
import { Ledger, type NonceReplay, type X402Hold } from "./Ledger.ts"

export interface Balance {
  readonly available: number
  readonly reserved: number
  readonly pending: number
}

const WithdrawalRow = Schema.Struct({
  withdrawal_id: Schema.String,
  wallet: Schema.String,
  to_address: Schema.String,
  amount: Schema.NumberFromString,
  status: Schema.Literals(["pending", "paid", "failed"]),
  tx_hash: Schema.NullOr(Schema.String),
  created_at: Schema.NumberFromString,
  paid_at: Schema.NullOr(Schema.NumberFromString)
})
const decodeWithdrawals = Schema.decodeUnknownEffect(Schema.Array(WithdrawalRow))

const toView = (row: typeof WithdrawalRow.Type): WithdrawalView => ({
  withdrawal_id: row.withdrawal_id,
  wallet: row.wallet,
  to: row.to_address,
  amount: row.amount,
  status: row.status,
  tx_hash: row.tx_hash,
  created_at: row.created_at,
  paid_at: row.paid_at
})

/** A pending withdrawal claimed for payout. */
export const ClaimedWithdrawal = Schema.Struct({
  withdrawal_id: Schema.String,
  to_address: Schema.String,
  amount: Schema.String,
  tx_hash: Schema.NullOr(Schema.String),
  attempts: Schema.Number
})
export type ClaimedWithdrawal = typeof ClaimedWithdrawal.Type
const decodeClaimed = Schema.decodeUnknownEffect(Schema.Array(ClaimedWithdrawal))

const backoffSeconds = (attempts: number) => Math.min(60, 2 ** Math.min(6, attempts))

/**
 * The prepaid-credit book: balances, deposits (pending until their authorization lands) and
 * withdrawals (debited at once, paid out on chain, credited back when they cannot be paid). Each
 * change is one statement or one transaction with its ledger rows.
 */
export class Wallets extends Context.Service<
  Wallets,
  {
    readonly balance: (wallet: string) => Effect.Effect<Balance>
    /** Reserves the deposit's authorization, captures it whole and queues it; the deposit is pending. */
    readonly recordDeposit: (input: {
      readonly depositId: string
      readonly payer: string
      readonly amount: number
      readonly hold: X402Hold
    }) => Effect.Effect<void, NonceReplay>
    /** Deposits whose authorization can no longer settle are `failed`; returns their ids. */
    readonly failDeposits: Effect.Effect<ReadonlyArray<string>>
    /** Debits the balance and records the withdrawal in one statement, unless the balance is short or the nonce used. */
    readonly debitWithdrawal: (input: {
      readonly withdrawalId: string
      readonly wallet: string
      readonly to: string
      readonly amount: number
      readonly nonce: string
    }) => Effect.Effect<"debited" | "insufficient" | "nonce_used">
    readonly withdrawalById: (id: string) => Effect.Effect<WithdrawalView | undefined>
    readonly withdrawalByNonce: (nonce: string) => Effect.Effect<WithdrawalView | undefined>
    /** Claims up to 8 due withdrawals for a payout attempt. */
    readonly claimWithdrawals: Effect.Effect<ReadonlyArray<ClaimedWithdrawal>>
    readonly recordWithdrawalBroadcast: (id: string, hash: string) => Effect.Effect<void>
    readonly withdrawalPaid: (id: string, hash: string) => Effect.Effect<void>
    /** Later attempt (`clearTx`: no transfer outstanding); past the last attempt it fails and is credited back. */
    readonly withdrawalRetry: (
      row: ClaimedWithdrawal,
      reason: string,
      clearTx: boolean,
      giveUp: boolean
    ) => Effect.Effect<void>
  }
>()("router/ledger/Wallets") {
  static readonly layer = Layer.effect(
    Wallets,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const ledger = yield* Ledger

      const balance = (wallet: string) =>
        sql<{ available: string; reserved: string; pending: string }>`
          SELECT coalesce(b.available, 0)::text AS available, coalesce(b.reserved, 0)::text AS reserved,
            (SELECT coalesce(sum(amount), 0) FROM deposits
             WHERE wallet = ${wallet.toLowerCase()} AND status = 'pending')::text AS pending
          FROM (SELECT ${wallet.toLowerCase()}::text AS wallet) w
          LEFT JOIN balance_figures b ON b.wallet = w.wallet
        `.pipe(
          Effect.map(([row]) => ({
            available: Number(row!.available),
            reserved: Number(row!.reserved),
            pending: Number(row!.pending)
          })),
          Effect.orDie
        )

      const recordDeposit = Effect.fn("Wallets.recordDeposit")(function* (input: {
        readonly depositId: string
        readonly payer: string
        readonly amount: number
        readonly hold: X402Hold
      }) {
        const { depositId, payer, amount } = input
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* ledger
                .reserveX402(
                  {
                    requestId: depositId,
                    dialect: "deposit",
                    payer,
                    requestedModel: "credits",
                    modelClass: "credits",
                    providerId: "credits",
                    authorized: amount,
                    agent: {}
                  },
                  input.hold
                )
                .pipe(
                  // A database fault here is rendered as a 503 by the middleware (it moved no money).
                  Effect.catchTag("ServiceUnavailable", (unavailable) => Effect.die(unavailable))
                )
              // Captured for the full amount and queued: Settlement submits it like any other capture.
              yield* sql`
                WITH request AS (
                  UPDATE requests SET status = 'captured', charged = authorized, finished_at = now()
                  WHERE request_id = ${depositId} AND status = 'reserved' RETURNING request_id
                ), hold AS (
                  UPDATE x402_authorizations SET status = 'pending', updated_at = now()
                  WHERE request_id IN (SELECT request_id FROM request) RETURNING request_id
                ), created AS (
                  INSERT INTO deposits (deposit_id, wallet, amount, request_id, status)
                  SELECT request_id, ${payer}, ${amount}, request_id, 'pending' FROM hold
                  RETURNING deposit_id
                )
                INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                SELECT deposit_id, ${payer}, 'deposit_pending', ${amount}, deposit_id FROM created
              `
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
      })

      const failDeposits = sql<{ deposit_id: string }>`
        WITH failed AS (
          UPDATE deposits d SET status = 'failed'
          FROM x402_authorizations a
          WHERE a.request_id = d.request_id AND a.status = 'failed' AND d.status = 'pending'
          RETURNING d.deposit_id, d.wallet, d.amount
        )
        INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
        SELECT deposit_id, wallet, 'deposit_failed', amount, deposit_id FROM failed
        RETURNING ref AS deposit_id
      `.pipe(
        Effect.map((rows) => rows.map((r) => r.deposit_id)),
        Effect.orDie
      )

      const selectWithdrawals = (where: Statement.Fragment) =>
        sql`
          SELECT withdrawal_id, wallet, to_address, amount::text AS amount, status, tx_hash,
            extract(epoch FROM created_at)::bigint::text AS created_at,
            extract(epoch FROM paid_at)::bigint::text AS paid_at
          FROM withdrawals WHERE ${where}
        `.pipe(
          Effect.flatMap(decodeWithdrawals),
          Effect.map((rows) => rows.map(toView)[0]),
          Effect.orDie
        )

      const debitWithdrawal = Effect.fn("Wallets.debitWithdrawal")(function* (input: {
        readonly withdrawalId: string
        readonly wallet: string
        readonly to: string
        readonly amount: number
        readonly nonce: string
      }) {
        const { withdrawalId, wallet, to, amount, nonce } = input
        // The debit checks the row itself: what credit captures gave back is folded into it first (D315).
        yield* ledger.foldCredit
        // One statement: the debit only where the balance covers it, the withdrawal and its ledger row.
        const debited = yield* sql`
          WITH debit AS (
            UPDATE wallet_balances SET available = available - ${amount}, updated_at = now()
            WHERE wallet = ${wallet} AND available >= ${amount} RETURNING wallet
          ), created AS (
            INSERT INTO withdrawals (withdrawal_id, wallet, amount, to_address, nonce, status)
            SELECT ${withdrawalId}, wallet, ${amount}, ${to}, ${nonce}, 'pending' FROM debit
            RETURNING withdrawal_id, wallet
          )
          INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
          SELECT NULL, wallet, 'withdrawal_debited', ${amount}, withdrawal_id FROM created
          RETURNING ref
        `.pipe(
          Effect.map((rows) => (rows.length > 0 ? ("debited" as const) : ("insufficient" as const))),
          Effect.catchTag("SqlError", (error) =>
            error.reason._tag === "UniqueViolation"
              ? Effect.succeed("nonce_used" as const)
              : Effect.die(error)
          )
        )
        return debited
      })

      const claimWithdrawals = sql`
        UPDATE withdrawals SET attempts = attempts + 1, next_attempt_at = now() + interval '2 minutes',
          updated_at = now()
        WHERE withdrawal_id IN (
          SELECT withdrawal_id FROM withdrawals WHERE status = 'pending' AND next_attempt_at <= now()
          ORDER BY created_at LIMIT 8 FOR UPDATE SKIP LOCKED
        )
        RETURNING withdrawal_id, to_address, amount::text AS amount, tx_hash, attempts
      `.pipe(Effect.flatMap(decodeClaimed), Effect.orDie)

      const recordWithdrawalBroadcast = (id: string, hash: string) =>
        sql`UPDATE withdrawals SET tx_hash = ${hash} WHERE withdrawal_id = ${id}`.pipe(
          Effect.asVoid,
          Effect.orDie
        )

      const withdrawalPaid = (id: string, hash: string) =>
        sql`
          WITH paid AS (
            UPDATE withdrawals SET status = 'paid', tx_hash = ${hash}, paid_at = now(), updated_at = now()
            WHERE withdrawal_id = ${id} AND status = 'pending'
            RETURNING withdrawal_id, wallet, amount
          )
          INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
          SELECT NULL, wallet, 'withdrawal_paid', amount, ${hash} FROM paid
        `.pipe(Effect.asVoid, Effect.orDie)

      const withdrawalRetry = (row: ClaimedWithdrawal, reason: string, clearTx: boolean, giveUp: boolean) =>
        (giveUp
          ? sql`
              WITH failed AS (
                UPDATE withdrawals SET status = 'failed', tx_hash = NULL, last_error = ${reason.slice(0, 300)},
                  updated_at = now()
                WHERE withdrawal_id = ${row.withdrawal_id} AND status = 'pending'
                RETURNING withdrawal_id, wallet, amount
              ), returned AS (
                INSERT INTO wallet_balances (wallet, available) SELECT wallet, amount FROM failed
                ON CONFLICT (wallet) DO UPDATE
                SET available = wallet_balances.available + EXCLUDED.available, updated_at = now()
              )
              INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
              SELECT NULL, wallet, 'withdrawal_returned', amount, withdrawal_id FROM failed
            `
          : sql`
              UPDATE withdrawals SET last_error = ${reason.slice(0, 300)},
                tx_hash = CASE WHEN ${clearTx} THEN NULL ELSE tx_hash END,
                next_attempt_at = now() + make_interval(secs => ${backoffSeconds(row.attempts)}), updated_at = now()
              WHERE withdrawal_id = ${row.withdrawal_id} AND status = 'pending'
            `
        ).pipe(Effect.asVoid, Effect.orDie)

      return Wallets.of({
        balance,
        recordDeposit,
        failDeposits,
        debitWithdrawal,
        withdrawalById: (id) => selectWithdrawals(sql`withdrawal_id = ${id}`),
        withdrawalByNonce: (nonce) => selectWithdrawals(sql`nonce = ${nonce}`),
        claimWithdrawals,
        recordWithdrawalBroadcast,
        withdrawalPaid,
        withdrawalRetry
      })
    })
  )
}
