import { randomBytes } from "node:crypto"
import { Clock, Context, Effect, Layer, Option, Result, Schedule, Schema } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import {
  getAddress,
  type Hash,
  type Hex,
  TransactionNotFoundError,
  TransactionReceiptNotFoundError,
  verifyTypedData
} from "viem"
import { Chain } from "../chain/Chain.ts"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import type { PaymentRequired } from "../domain/Payment.ts"
import { PayoutConfig } from "../ledger/Epochs.ts"
import { Ledger } from "../ledger/Ledger.ts"
import { Treasury } from "../ledger/Treasury.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { formatUsdc, Keys } from "./Keys.ts"
import { PaymentVerifier } from "./PaymentVerifier.ts"
import { paymentRequired } from "./X402.ts"

/** EIP-712 typed data of a credit withdrawal intent (docs/protocol.md section 4). */
export const withdrawalTypes = {
  CreditWithdrawal: [
    { name: "wallet", type: "address" },
    { name: "to", type: "address" },
    { name: "amount", type: "uint256" },
    { name: "nonce", type: "bytes32" },
    { name: "deadline", type: "uint256" }
  ]
} as const

export const withdrawalDomain = (chainId: number) => ({ name: "svc Credits", version: "1", chainId }) as const

const EvmAddress = Schema.String.check(
  Schema.isPattern(/^0x[0-9a-fA-F]{40}$/, { message: "expected a 0x-prefixed 20-byte address" })
)

/** `POST /v1/credits/withdrawals`: the intent and the owner's signature over it. */
export const WithdrawalRequest = Schema.Struct({
  wallet: EvmAddress,
  to: EvmAddress,
  amount: Schema.String.check(
    Schema.isPattern(/^[1-9]\d{0,14}$/, { message: "expected a positive integer of base units" })
  ),
  nonce: Schema.String.check(
    Schema.isPattern(/^0x[0-9a-fA-F]{64}$/, { message: "expected 32 bytes of 0x-prefixed hex" })
  ),
  deadline: Schema.Int.check(Schema.isGreaterThan(0)),
  signature: Schema.String.check(Schema.isPattern(/^0x[0-9a-fA-F]+$/, { message: "expected 0x hex" }))
})
export type WithdrawalRequest = typeof WithdrawalRequest.Type

export interface Deposit {
  readonly deposit_id: string
  readonly status: "pending"
  readonly amount: number
  readonly amount_usdc: string
  readonly wallet: string
}

export interface Balance {
  readonly available: number
  readonly reserved: number
  readonly pending: number
}

export const WithdrawalView = Schema.Struct({
  withdrawal_id: Schema.String,
  wallet: Schema.String,
  to: Schema.String,
  amount: Schema.Number,
  status: Schema.Literals(["pending", "paid", "failed"]),
  tx_hash: Schema.NullOr(Schema.String),
  created_at: Schema.Number,
  paid_at: Schema.NullOr(Schema.Number)
})
export type WithdrawalView = typeof WithdrawalView.Type

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

const Claimed = Schema.Struct({
  withdrawal_id: Schema.String,
  to_address: Schema.String,
  amount: Schema.String,
  tx_hash: Schema.NullOr(Schema.String),
  attempts: Schema.Number
})
type Claimed = typeof Claimed.Type
const decodeClaimed = Schema.decodeUnknownEffect(Schema.Array(Claimed))

/** After this many attempts with no transfer outstanding, the withdrawal fails and is credited back. */
const MAX_PAYOUT_ATTEMPTS = 12
const backoffSeconds = (attempts: number) => Math.min(60, 2 ** Math.min(6, attempts))

/**
 * Credits the deposit an x402 authorization funds, when that authorization lands: one statement run by
 * Settlement inside the transaction that marks it `landed`, so a deposit is credited exactly once and
 * never without its transfer. A no-op for every other authorization.
 */
export const creditLandedDeposit = (sql: SqlClient.SqlClient, requestId: string, txHash: string) => sql`
  WITH credited AS (
    UPDATE deposits SET status = 'credited', credited_at = now()
    WHERE request_id = ${requestId} AND status = 'pending'
    RETURNING deposit_id, wallet, amount
  ), balance AS (
    INSERT INTO wallet_balances (wallet, available) SELECT wallet, amount FROM credited
    ON CONFLICT (wallet) DO UPDATE
    SET available = wallet_balances.available + EXCLUDED.available, updated_at = now()
  )
  INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
  SELECT ${requestId}, wallet, 'deposit_credited', amount, ${txHash} FROM credited
`

/**
 * Prepaid credits: deposits by an exact x402 payment (credited when the transfer lands), balances, and
 * withdrawals by a wallet-signed EIP-712 intent, paid out on chain by a background loop.
 */
export class Credits extends Context.Service<
  Credits,
  {
    /** No header: the 402 quoting exactly `amount`. Otherwise verify, gate on invite, reserve, capture. */
    readonly deposit: (input: {
      readonly amount: number
      readonly paymentHeader: string | undefined
    }) => Effect.Effect<Deposit, PaymentRequired | Forbidden | InvalidRequest>
    readonly balance: (wallet: string) => Effect.Effect<Balance>
    readonly withdraw: (
      request: WithdrawalRequest
    ) => Effect.Effect<WithdrawalView, InvalidRequest | Unauthorized | Conflict>
    readonly withdrawal: (id: string) => Effect.Effect<WithdrawalView, NotFound>
    /** One pass of the payout queue (and of deposits whose funding failed); returns rows handled. */
    readonly runOnce: Effect.Effect<number>
  }
>()("router/payment/Credits") {
  static readonly make = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const ledger = yield* Ledger
    const treasury = yield* Treasury
    const verifier = yield* PaymentVerifier
    const keys = yield* Keys
    const config = yield* RouterConfig
    const { payoutFloor } = yield* PayoutConfig
    const resourceUrl = `${config.publicUrl}/v1/credits/deposits`

    const deposit = Effect.fn("Credits.deposit")(function* (input: {
      readonly amount: number
      readonly paymentHeader: string | undefined
    }) {
      const { amount } = input
      const floor = verifier.settings.soloSettleFloor
      if (amount < floor) {
        return yield* new InvalidRequest({
          code: "deposit_below_minimum",
          param: "amount_usdc",
          message: `A deposit is at least the solo settlement floor, ${formatUsdc(floor)} USDC`
        })
      }
      const description = `Prepaid credit deposit of ${formatUsdc(amount)} USDC`
      if (input.paymentHeader === undefined) {
        return yield* verifier.quote({ worstCase: amount, resourceUrl, description })
      }
      const verified = yield* verifier.verifyExact({
        header: input.paymentHeader,
        worstCase: amount,
        resourceUrl,
        description,
        nonceUnused: ledger.nonceUnused
      })
      const reject = (error: string) =>
        paymentRequired({
          settings: verifier.settings,
          worstCase: amount,
          resourceUrl,
          description,
          code: "payment_invalid",
          error
        })
      if (verified.value !== BigInt(amount)) {
        return yield* reject("a deposit authorization signs exactly the amount deposited")
      }
      const payer = verified.payer.toLowerCase()
      if (!(yield* keys.isInvited(payer))) {
        return yield* new Forbidden({
          code: "wallet_not_invited",
          message: "Prepaid-credit deposits are open to invited wallets only; nothing was charged"
        })
      }
      const depositId = `dep_${randomBytes(12).toString("hex")}`
      const { nonce, validAfter, validBefore } = verified.authorization
      yield* sql
        .withTransaction(
          Effect.gen(function* () {
            yield* ledger.reserveX402(
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
              { nonce, validAfter, validBefore, signature: verified.signature, balance: verified.balance }
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
        .pipe(
          Effect.catchTags({
            NonceReplay: () => Effect.fail(reject("authorization already used")),
            SqlError: Effect.die
          })
        )
      return {
        deposit_id: depositId,
        status: "pending",
        amount,
        amount_usdc: formatUsdc(amount),
        wallet: payer
      } satisfies Deposit
    })

    const balance = (wallet: string) =>
      sql<{ available: string; reserved: string; pending: string }>`
        SELECT coalesce(b.available, 0)::text AS available, coalesce(b.reserved, 0)::text AS reserved,
          (SELECT coalesce(sum(amount), 0) FROM deposits
           WHERE wallet = ${wallet.toLowerCase()} AND status = 'pending')::text AS pending
        FROM (SELECT ${wallet.toLowerCase()}::text AS wallet) w
        LEFT JOIN wallet_balances b ON b.wallet = w.wallet
      `.pipe(
        Effect.map(([row]) => ({
          available: Number(row!.available),
          reserved: Number(row!.reserved),
          pending: Number(row!.pending)
        })),
        Effect.orDie
      )

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

    const selectWithdrawals = (where: Statement.Fragment) =>
      sql`
        SELECT withdrawal_id, wallet, to_address, amount::text AS amount, status, tx_hash,
          extract(epoch FROM created_at)::bigint::text AS created_at,
          extract(epoch FROM paid_at)::bigint::text AS paid_at
        FROM withdrawals WHERE ${where}
      `.pipe(
        Effect.flatMap(decodeWithdrawals),
        Effect.map((rows) => rows.map(toView)),
        Effect.orDie
      )

    const withdrawal = Effect.fn("Credits.withdrawal")(function* (id: string) {
      const [view] = yield* selectWithdrawals(sql`withdrawal_id = ${id}`)
      if (view === undefined) {
        return yield* new NotFound({ code: "withdrawal_not_found", message: `No withdrawal ${id}` })
      }
      return view
    })

    const withdraw = Effect.fn("Credits.withdraw")(function* (request: WithdrawalRequest) {
      const wallet = request.wallet.toLowerCase()
      const nonce = request.nonce.toLowerCase()
      const amount = Number(request.amount)
      const nowS = Math.floor((yield* Clock.currentTimeMillis) / 1000)
      if (request.deadline <= nowS) {
        return yield* new InvalidRequest({
          code: "withdrawal_expired",
          param: "deadline",
          message: "The withdrawal intent's deadline has passed; sign a new one"
        })
      }
      if (amount < payoutFloor) {
        return yield* new InvalidRequest({
          code: "below_payout_floor",
          param: "amount",
          message: `A withdrawal is at least the payout floor of ${payoutFloor} base units`
        })
      }
      const signed = yield* Effect.tryPromise(() =>
        verifyTypedData({
          address: getAddress(wallet),
          domain: withdrawalDomain(chain.chainId),
          types: withdrawalTypes,
          primaryType: "CreditWithdrawal",
          message: {
            wallet: getAddress(wallet),
            to: getAddress(request.to.toLowerCase()),
            amount: BigInt(request.amount),
            nonce: nonce as Hex,
            deadline: BigInt(request.deadline)
          },
          signature: request.signature as Hex
        })
      ).pipe(Effect.orElseSucceed(() => false))
      if (!signed) {
        return yield* new Unauthorized({
          code: "invalid_withdrawal_signature",
          message: "signature is not a CreditWithdrawal signed by wallet over these fields"
        })
      }
      const replayed = (id: string) =>
        new Conflict({
          code: "idempotency_replay",
          param: "nonce",
          message: `This nonce already made withdrawal ${id}; read it at /v1/credits/withdrawals/${id}`
        })
      const [earlier] = yield* selectWithdrawals(sql`nonce = ${nonce}`)
      if (earlier !== undefined) return yield* replayed(earlier.withdrawal_id)

      const id = `wd_${randomBytes(12).toString("hex")}`
      const to = request.to.toLowerCase()
      // One statement: the debit only where the balance covers it, the withdrawal and its ledger row.
      const debited = yield* sql<{ ref: string }>`
        WITH debit AS (
          UPDATE wallet_balances SET available = available - ${amount}, updated_at = now()
          WHERE wallet = ${wallet} AND available >= ${amount} RETURNING wallet
        ), created AS (
          INSERT INTO withdrawals (withdrawal_id, wallet, amount, to_address, nonce, status)
          SELECT ${id}, wallet, ${amount}, ${to}, ${nonce}, 'pending' FROM debit
          RETURNING withdrawal_id, wallet
        )
        INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
        SELECT NULL, wallet, 'withdrawal_debited', ${amount}, withdrawal_id FROM created
        RETURNING ref
      `.pipe(
        Effect.catchTag("SqlError", (error) =>
          error.reason._tag === "UniqueViolation"
            ? Effect.flatMap(selectWithdrawals(sql`nonce = ${nonce}`), ([row]) =>
                Effect.fail(replayed(row?.withdrawal_id ?? "unknown"))
              )
            : Effect.die(error)
        )
      )
      if (debited.length === 0) {
        const { available } = yield* balance(wallet)
        return yield* new InvalidRequest({
          code: "insufficient_balance",
          param: "amount",
          message: `The available balance is ${available} base units, below the ${amount} asked; nothing was debited`
        })
      }
      return yield* Effect.orDie(withdrawal(id))
    })

    // ---- payouts, off every response's path ----

    const claim = sql`
      UPDATE withdrawals SET attempts = attempts + 1, next_attempt_at = now() + interval '2 minutes',
        updated_at = now()
      WHERE withdrawal_id IN (
        SELECT withdrawal_id FROM withdrawals WHERE status = 'pending' AND next_attempt_at <= now()
        ORDER BY created_at LIMIT 8 FOR UPDATE SKIP LOCKED
      )
      RETURNING withdrawal_id, to_address, amount::text AS amount, tx_hash, attempts
    `.pipe(Effect.flatMap(decodeClaimed), Effect.orDie)

    const markPaid = (row: Claimed, hash: string) =>
      sql`
        WITH paid AS (
          UPDATE withdrawals SET status = 'paid', tx_hash = ${hash}, paid_at = now(), updated_at = now()
          WHERE withdrawal_id = ${row.withdrawal_id} AND status = 'pending'
          RETURNING withdrawal_id, wallet, amount
        )
        INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
        SELECT NULL, wallet, 'withdrawal_paid', amount, ${hash} FROM paid
      `.pipe(Effect.orDie)

    const retryLater = (row: Claimed, reason: string, clearTx: boolean) =>
      Effect.gen(function* () {
        if (clearTx && row.attempts >= MAX_PAYOUT_ATTEMPTS) {
          yield* sql`
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
          `.pipe(Effect.orDie)
          return yield* Effect.logError("withdrawal failed; credited back", { id: row.withdrawal_id, reason })
        }
        yield* sql`
          UPDATE withdrawals SET last_error = ${reason.slice(0, 300)},
            tx_hash = CASE WHEN ${clearTx} THEN NULL ELSE tx_hash END,
            next_attempt_at = now() + make_interval(secs => ${backoffSeconds(row.attempts)}), updated_at = now()
          WHERE withdrawal_id = ${row.withdrawal_id} AND status = 'pending'
        `.pipe(Effect.orDie)
        yield* Effect.logWarning("withdrawal payout attempt failed", { id: row.withdrawal_id, reason })
      })

    /**
     * Where a transfer sent by an earlier attempt stands. Only a transaction the node has never heard of is
     * `unknown` (and is sent again); an unreadable node is `pending`, so a payout is never sent twice.
     */
    const transferState = (hash: Hash) =>
      Effect.gen(function* () {
        const receipt = yield* Effect.tryPromise({
          try: () => chain.publicClient.getTransactionReceipt({ hash }),
          catch: (error) => error
        }).pipe(Effect.option)
        if (Option.isSome(receipt)) return receipt.value.status
        const known = yield* Effect.tryPromise({
          try: () => chain.publicClient.getTransaction({ hash }),
          catch: (error) => error
        }).pipe(
          Effect.as(true),
          Effect.catch((error) =>
            Effect.succeed(
              !(error instanceof TransactionNotFoundError || error instanceof TransactionReceiptNotFoundError)
            )
          )
        )
        return known ? "pending" : "unknown"
      })

    const payOne = (row: Claimed) =>
      Effect.gen(function* () {
        if (row.tx_hash !== null) {
          const state = yield* transferState(row.tx_hash as Hash)
          if (state === "success") return yield* markPaid(row, row.tx_hash)
          if (state === "pending") return yield* retryLater(row, "transfer still pending", false)
        }
        const sent = yield* Effect.result(
          treasury.send({
            _tag: "Withdrawal",
            withdrawalId: row.withdrawal_id,
            to: getAddress(row.to_address),
            amount: BigInt(row.amount)
          })
        )
        if (Result.isFailure(sent)) return yield* retryLater(row, sent.failure.message, true)
        const hash = sent.success
        // Recorded before it is awaited: a retry after a crash looks this transfer up instead of paying twice.
        yield* sql`UPDATE withdrawals SET tx_hash = ${hash} WHERE withdrawal_id = ${row.withdrawal_id}`.pipe(
          Effect.orDie
        )
        const outcome = yield* Effect.result(treasury.confirm(hash))
        if (Result.isFailure(outcome)) return yield* retryLater(row, outcome.failure.message, false)
        if (outcome.success.status === "success") return yield* markPaid(row, hash)
        return yield* retryLater(row, "payout transfer reverted", true)
      }).pipe(Effect.withSpan("Credits.payout", { attributes: { withdrawal_id: row.withdrawal_id } }))

    /** A deposit whose authorization can no longer settle is `failed`: it never reaches the balance. */
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
    `.pipe(Effect.orDie)

    const runOnce = Effect.gen(function* () {
      const failed = yield* failDeposits
      const rows = yield* claim
      yield* Effect.forEach(rows, payOne, { concurrency: 4, discard: true })
      return rows.length + failed.length
    }).pipe(Effect.withSpan("Credits.runOnce"))

    return Credits.of({ deposit, balance, withdraw, withdrawal, runOnce })
  })

  /** The service plus its payout loop. */
  static readonly layer = Layer.effect(
    Credits,
    Effect.gen(function* () {
      const credits = yield* Credits.make
      yield* credits.runOnce.pipe(
        Effect.catchCause((cause) => Effect.logError("credits pass failed", cause)),
        Effect.repeat(Schedule.spaced("500 millis")),
        Effect.forkScoped
      )
      return credits
    })
  )
}
