import { randomBytes } from "node:crypto"
import { Clock, Effect, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { getAddress, type Hash } from "viem"
import { Chain, type ChainError } from "../chain/Chain.ts"
import { idList } from "../db/IdList.ts"
import { RouterConfig } from "../RouterConfig.ts"
import { Treasury } from "./Treasury.ts"

const Accrued = Schema.Struct({
  provider_id: Schema.String,
  signer: Schema.NullOr(Schema.String),
  total: Schema.String,
  request_ids: Schema.Array(Schema.String)
})
const decodeAccrued = Schema.decodeUnknownEffect(Schema.Array(Accrued))

interface Payout {
  readonly payout_id: string
  readonly provider_id: string
  readonly to_address: string
  readonly amount: string
  readonly tx_hash: string | null
}

/** The first wait after a pass that left shares unpaid (D568), doubled after each such pass up to the most. */
const UNPAID_WAIT_MS = 60_000
const UNPAID_WAIT_MAX_MS = 10 * 60_000

export interface ProviderPayouts {
  /**
   * One pass, under the epoch-close lock: resumes payouts left `paying`, then pays every provider whose
   * final, unpaid shares reach the payout floor. Returns the number of payouts that became `paid`.
   */
  readonly settle: Effect.Effect<number>
}

/**
 * Provider payouts at epoch close (docs/decisions.md D56, docs/protocol.md 3). A provider's share of a
 * request is payable once the request's epoch has ended and its payment is final: the x402 authorization
 * `landed`, a funded key's capture, or a session turn whose session funding is a key or a landed
 * authorization. Payable shares at or above the floor are claimed (`requests.payout_id`, so none is paid
 * twice) into one `provider_payouts` row per provider, sent in one transfer from the treasury to the
 * provider's registered signer; below the floor they accrue. The claim is recorded before the transfer
 * is sent, and the transfer is sent through `Treasury` under the payout's id (docs/decisions.md D170): a
 * resumed payout, with or without its hash, gets the transaction already recorded for it; its shares
 * accrue again only when the transfer moved nothing (refused before signing, reverted or replaced).
 */
export const makeProviderPayouts = (options: { readonly payoutFloor: number }) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const treasury = yield* Treasury
    const { epochSeconds } = yield* RouterConfig
    // The last pass that left shares unpaid (the treasury could not cover them, or a transfer moved nothing,
    // D568): the treasury's balance then, and until when a pass that finds it no larger skips the shares'
    // aggregation (the next wait twice as long, up to ten minutes): the other providers' payouts wait with it.
    // Any rise of the balance tries again at once.
    let unpaid: { readonly balance: bigint; readonly until: number; readonly waitMs: number } | undefined

    const markPaid = (payout: Payout, hash: Hash) =>
      sql
        .withTransaction(
          Effect.gen(function* () {
            const paid = yield* sql`
              UPDATE provider_payouts SET status = 'paid', tx_hash = ${hash}, paid_at = now()
              WHERE payout_id = ${payout.payout_id} AND status = 'paying' RETURNING payout_id`
            if (paid.length === 0) return false
            yield* sql`INSERT INTO ledger_entries (account, kind, amount, ref)
                       VALUES (${`provider:${payout.provider_id}`}, 'provider_paid', ${payout.amount}, ${hash})`
            return true
          })
        )
        .pipe(
          Effect.orDie,
          Effect.tap((paid) =>
            paid
              ? Effect.annotateCurrentSpan({ provider_id: payout.provider_id, amount: payout.amount })
              : Effect.void
          )
        )

    /** Nothing was paid: the payout is `failed` and its shares accrue again. */
    const release = (payout: Payout, reason: string) =>
      sql
        .withTransaction(
          Effect.gen(function* () {
            const failed = yield* sql`
              UPDATE provider_payouts SET status = 'failed', last_error = ${reason}
              WHERE payout_id = ${payout.payout_id} AND status = 'paying' RETURNING payout_id`
            if (failed.length > 0) {
              yield* sql`UPDATE requests SET payout_id = NULL WHERE payout_id = ${payout.payout_id}`
            }
          })
        )
        .pipe(
          Effect.orDie,
          Effect.andThen(
            Effect.logWarning("provider payout not paid; its shares accrue again", {
              payout_id: payout.payout_id,
              provider_id: payout.provider_id,
              reason
            })
          )
        )

    /**
     * Sends a claimed payout and settles it by what the chain did. Sending is idempotent per payout
     * (ledger/Treasury.ts), so a payout resumed after a crash, with or without its hash, gets the
     * transaction already recorded for it. A refused estimate recorded nothing: the payout is released.
     */
    const sendAndSettle = (payout: Payout): Effect.Effect<boolean, ChainError> =>
      Effect.gen(function* () {
        const hash = yield* treasury
          .send({
            _tag: "ProviderPayout",
            payoutId: payout.payout_id,
            to: getAddress(payout.to_address),
            amount: BigInt(payout.amount)
          })
          .pipe(
            Effect.catchTag("ChainError", (e) =>
              e.reason === "Reverted" ? Effect.as(release(payout, e.message), undefined) : Effect.fail(e)
            )
          )
        if (hash === undefined) return false
        if (payout.tx_hash !== hash) {
          yield* sql`UPDATE provider_payouts SET tx_hash = ${hash} WHERE payout_id = ${payout.payout_id}`.pipe(
            Effect.orDie
          )
        }
        const outcome = yield* treasury.confirm(hash)
        if (outcome.status === "success") return yield* markPaid(payout, hash)
        yield* release(
          payout,
          `the payout transaction ${outcome.status === "replaced" ? "was replaced" : "reverted"}`
        )
        return false
      })

    const resumeOne = (payout: Payout): Effect.Effect<boolean, ChainError> =>
      sendAndSettle(payout).pipe(
        Effect.withSpan("Payouts.resume", { attributes: { payout_id: payout.payout_id } })
      )

    const claim = (provider: typeof Accrued.Type, signer: string, epochId: number) =>
      Effect.gen(function* () {
        // The payout's transfer cannot be in a block mined before the claim (kept for audits).
        const fromBlock = (yield* chain.blockNumber()) + 1n
        const payout: Payout = {
          payout_id: `po_${randomBytes(12).toString("hex")}`,
          provider_id: provider.provider_id,
          to_address: getAddress(signer),
          amount: provider.total,
          tx_hash: null
        }
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`
                INSERT INTO provider_payouts (payout_id, provider_id, to_address, amount, status, epoch_id, from_block)
                VALUES (${payout.payout_id}, ${payout.provider_id}, ${payout.to_address}, ${payout.amount},
                        'paying', ${epochId}, ${fromBlock.toString()})`
              const linked = yield* sql`
                UPDATE requests SET payout_id = ${payout.payout_id}
                WHERE request_id IN ${idList(sql, provider.request_ids)} AND payout_id IS NULL RETURNING request_id`
              if (linked.length !== provider.request_ids.length) {
                return yield* Effect.die(
                  new Error(`shares of ${payout.provider_id} were claimed concurrently`)
                )
              }
            })
          )
          .pipe(Effect.orDie)
        return payout
      })

    const pay = (provider: typeof Accrued.Type, signer: string, epochId: number) =>
      Effect.flatMap(claim(provider, signer, epochId), sendAndSettle).pipe(
        Effect.withSpan("Payouts.pay", { attributes: { provider_id: provider.provider_id } })
      )

    const attempt = (work: Effect.Effect<boolean, ChainError>, providerId: string) =>
      work.pipe(
        Effect.catchTag("ChainError", (e) =>
          Effect.as(
            Effect.logWarning("provider payout failed; will resume", {
              provider_id: providerId,
              error: e.message
            }),
            false
          )
        )
      )

    const settle = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const epoch = Math.floor(now / (epochSeconds * 1000))
      let paid = 0
      const open = yield* sql<Payout>`
        SELECT payout_id, provider_id, to_address, amount::text AS amount, tx_hash
        FROM provider_payouts WHERE status = 'paying' ORDER BY created_at
      `.pipe(Effect.orDie)
      for (const payout of open) if (yield* attempt(resumeOne(payout), payout.provider_id)) paid++

      // What the treasury holds, read only when it decides something (unread: no check, as before). Unchanged
      // since a pass that left shares unpaid, the aggregation below (every unpaid share of the ended epochs) and
      // the claims would only be redone.
      const treasuryBalance = Effect.map(
        Effect.option(chain.balanceOf(chain.treasury)),
        Option.getOrUndefined
      )
      let balance = unpaid === undefined ? undefined : yield* treasuryBalance
      if (balance !== undefined && unpaid !== undefined && balance <= unpaid.balance && now < unpaid.until)
        return paid

      // One payout in flight per provider, so a transfer found in the logs can only be that payout's.
      // It reads the unpaid shares of ended epochs and nothing else (D509–D511): a request's `epoch_id` is
      // its receipt's, written by the statement that inserts that receipt, and `requests_share_unpaid
      // (epoch_id, provider_id)` holds the unpaid shares, so `epoch_id < epoch` starts at the ended epochs and
      // never reads the current epoch's (nor every past receipt, as `receipts.epoch_id` did). The ids come as
      // an array (InitPlan): whatever the statistics say of `epoch_id < epoch` (they count paid history too),
      // the planner then expects a few rows and reaches each through its key, never a scan of the history.
      const accrued = yield* sql`
        SELECT q.provider_id, p.signer, sum(l.amount)::text AS total,
               array_agg(q.request_id ORDER BY q.request_id) AS request_ids
        FROM requests q
        JOIN receipts r ON r.request_id = q.request_id
        JOIN ledger_entries l ON l.request_id = q.request_id AND l.kind = 'provider_share'
        LEFT JOIN providers p ON p.provider_id = q.provider_id
        LEFT JOIN x402_authorizations a ON a.request_id = q.request_id
        LEFT JOIN sessions s ON q.payment_kind = 'session' AND s.session_id = q.session_id
        LEFT JOIN x402_authorizations f ON s.funding_kind = 'x402' AND f.request_id = s.funding_request_id
        WHERE q.status = 'captured' AND q.payout_id IS NULL AND q.dialect <> 'deposit'
          AND q.epoch_id < ${epoch}
          AND q.request_id = ANY(ARRAY(
            SELECT u.request_id FROM requests u
            WHERE u.status = 'captured' AND u.payout_id IS NULL AND u.dialect <> 'deposit' AND u.epoch_id < ${epoch}
          ))
          AND (
            (q.payment_kind = 'x402' AND a.status = 'landed')
            OR q.payment_kind = 'credit'
            OR (q.payment_kind = 'session' AND (s.funding_kind = 'credit' OR f.status = 'landed'))
          )
          AND NOT EXISTS (SELECT 1 FROM provider_payouts o WHERE o.provider_id = q.provider_id AND o.status = 'paying')
        GROUP BY q.provider_id, p.signer
        HAVING sum(l.amount) >= ${options.payoutFloor}
        ORDER BY q.provider_id
      `.pipe(Effect.flatMap(decodeAccrued), Effect.orDie)
      if (accrued.length > 0 && balance === undefined) balance = yield* treasuryBalance
      let left = balance
      let short = false
      for (const provider of accrued) {
        if (provider.signer === null) {
          yield* Effect.logWarning("provider shares accrue: no registered signer to pay", {
            provider_id: provider.provider_id
          })
          continue
        }
        // Refused before its claim: a transfer the treasury cannot cover would only be claimed, refused by the
        // chain's estimate and released again (D568).
        const amount = BigInt(provider.total)
        if (left !== undefined && amount > left) {
          short = true
          yield* Effect.logWarning("provider shares accrue: the treasury cannot cover their payout yet", {
            provider_id: provider.provider_id,
            amount: provider.total,
            treasury_balance: left.toString()
          })
          continue
        }
        if (yield* attempt(pay(provider, provider.signer, epoch - 1), provider.provider_id)) {
          paid++
          if (left !== undefined) left -= amount
        } else short = true
      }
      const waitMs = Math.min((unpaid?.waitMs ?? UNPAID_WAIT_MS / 2) * 2, UNPAID_WAIT_MAX_MS)
      unpaid = short && balance !== undefined ? { balance, until: now + waitMs, waitMs } : undefined
      return paid
    }).pipe(Effect.withSpan("Payouts.settle"))

    return { settle } satisfies ProviderPayouts
  })
