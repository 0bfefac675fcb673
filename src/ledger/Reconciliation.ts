import { Cause, Config, Context, Duration, Effect, Exit, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../chain/Chain.ts"
import { makeChainReads } from "./ChainReads.ts"
import { type Discrepancy, MAX_RECORDED, type ReconciliationResult } from "./Discrepancies.ts"
import { withAdvisoryLock } from "./Epochs.ts"
import {
  checkEpochs,
  checkFees,
  checkPayouts,
  checkRefunds,
  checkSettlements,
  checkTreasury
} from "./ReconciliationChecks.ts"

export type { Discrepancy, DiscrepancyKind, ReconciliationResult } from "./Discrepancies.ts"

const RECONCILIATION_LOCK = 7402003

/**
 * Compares the ledger with the chain and with itself:
 * - every `landed` x402 authorization has, in its recorded transaction, a Transfer payer → treasury of
 *   exactly its value, a `settled` ledger row of that value, and capture + refund due equal to it;
 * - every `paid` refund batch has, in its transaction, a Transfer treasury (or the router signer, D16)
 *   → payer of the batch total, and `refund_paid` rows summing to it;
 * - every `paid` provider payout has, in its transaction, a Transfer treasury (or the router signer)
 *   → the provider's signer of exactly its amount, one `provider_paid` row of that amount, and the
 *   provider shares of the requests it pays summing to it;
 * - the treasury's net movement in those transactions equals settled minus refunds and payouts paid in
 *   the ledger;
 * - for every captured request, router fee + provider share = capture = the charge, fee = 7%;
 * - every closed epoch's root is the one on chain, and every receipt of a closed epoch is in it.
 * Each run is a `reconciliation_runs` row: `running`, then `ok` or `failed` with the first discrepancies.
 * The checks are in `ReconciliationChecks.ts`, what they read of the chain in `ChainReads.ts`.
 */
export class Reconciliation extends Context.Service<
  Reconciliation,
  { readonly runOnce: Effect.Effect<ReconciliationResult> }
>()("router/ledger/Reconciliation") {
  static readonly make = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const sources = { sql, chain, reads: makeChainReads(chain) }

    // One snapshot for every read of a run: a settlement landing mid-run must not look like a mismatch.
    const checks = Effect.gen(function* () {
      yield* sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`
      const settlements = yield* checkSettlements(sources)
      const refunds = yield* checkRefunds(sources)
      const payouts = yield* checkPayouts(sources)
      const treasury = yield* checkTreasury(sql, settlements.chainIn, refunds.chainOut + payouts.chainOut)
      const fees = yield* checkFees(sql)
      const epochs = yield* checkEpochs(sources)
      return [
        ...settlements.discrepancies,
        ...refunds.discrepancies,
        ...payouts.discrepancies,
        ...treasury,
        ...fees,
        ...epochs
      ]
    }).pipe(
      Effect.catchTag("ChainError", (e) =>
        Effect.succeed<Array<Discrepancy>>([
          { kind: "chain_unreachable", detail: `the chain could not be read: ${e.message}` }
        ])
      ),
      (self) => sql.withTransaction(self),
      Effect.orDie
    )

    const finish = (id: string, discrepancies: ReadonlyArray<Discrepancy>) => {
      const status = discrepancies.length === 0 ? ("ok" as const) : ("failed" as const)
      const recorded = discrepancies.slice(0, MAX_RECORDED)
      return Effect.as(
        sql`UPDATE reconciliation_runs SET status = ${status}, finished_at = now(),
              discrepancies = ${JSON.stringify(recorded)}::jsonb WHERE id = ${id}`.pipe(Effect.orDie),
        { id: Number(id), status, discrepancies: recorded } satisfies ReconciliationResult
      )
    }

    const runOnce = Effect.gen(function* () {
      const [run] = yield* sql<{ id: string }>`
        INSERT INTO reconciliation_runs (status) VALUES ('running') RETURNING id::text AS id
      `.pipe(Effect.orDie)
      const id = run!.id
      const discrepancies = yield* checks.pipe(
        Effect.onExit((exit) =>
          Exit.isSuccess(exit)
            ? Effect.void
            : Cause.hasInterruptsOnly(exit.cause)
              ? // A run that never finished says nothing: the previous result stands.
                Effect.ignore(sql`DELETE FROM reconciliation_runs WHERE id = ${id}`)
              : Effect.ignore(
                  finish(id, [
                    { kind: "reconciliation_error", detail: Cause.pretty(exit.cause).slice(0, 300) }
                  ])
                )
        )
      )
      const result = yield* finish(id, discrepancies)
      if (result.status === "failed") {
        yield* Effect.logError("reconciliation failed", {
          run: result.id,
          discrepancies: discrepancies.length,
          first: discrepancies[0]
        })
      }
      return result
    }).pipe(Effect.withSpan("Reconciliation.runOnce"))

    return Reconciliation.of({ runOnce })
  })

  /** The service plus a run every `RECONCILIATION_INTERVAL_SECONDS` (default 300; 0: no schedule). */
  static readonly layer = Layer.effect(
    Reconciliation,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const service = yield* Reconciliation.make
      const every = yield* Config.Int("RECONCILIATION_INTERVAL_SECONDS").pipe(Config.withDefault(300))
      if (every > 0) {
        yield* Effect.sleep(Duration.seconds(every)).pipe(
          Effect.andThen(withAdvisoryLock(RECONCILIATION_LOCK)(service.runOnce)),
          Effect.provideService(SqlClient.SqlClient, sql),
          Effect.catchCause((cause) => Effect.logError("reconciliation run failed", cause)),
          Effect.forever,
          Effect.forkScoped
        )
      }
      return service
    })
  )
}
