import { Context, Effect, Layer, Metric, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../chain/Chain.ts"
import { type Readiness as ReadinessBody, ReconciliationStatus } from "../domain/System.ts"
import { RouterConfig } from "../RouterConfig.ts"

export const reconciliationOk = Metric.gauge("svc_reconciliation_ok", {
  description: "1 when the last ledger/chain reconciliation passed, else 0"
})

export const reconciliationTimestamp = Metric.gauge("svc_reconciliation_last_run_timestamp_seconds", {
  description: "Unix time of the last finished reconciliation run (0 when none)"
})

const LastRun = Schema.Struct({
  status: Schema.String,
  finished_at: Schema.NullOr(Schema.Number),
  discrepancies: Schema.Array(Schema.Unknown)
})

export class Readiness extends Context.Service<
  Readiness,
  {
    readonly check: Effect.Effect<ReadinessBody>
    /** Refreshes the reconciliation gauges from the book of record. */
    readonly refreshGauges: Effect.Effect<void>
  }
>()("router/ledger/Readiness") {
  static readonly layer = Layer.effect(
    Readiness,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const chain = yield* Chain
      const config = yield* RouterConfig

      const lastRun = sql`
        SELECT status,
               extract(epoch from finished_at)::float8 AS finished_at,
               discrepancies
        FROM reconciliation_runs ORDER BY id DESC LIMIT 1
      `.pipe(
        Effect.flatMap((rows) =>
          rows.length === 0
            ? Effect.succeedNone
            : Effect.map(Schema.decodeUnknownEffect(LastRun)(rows[0]), Option.some)
        ),
        Effect.orDie
      )

      const reconciliation = Effect.map(lastRun, (row) =>
        Option.match(row, {
          onNone: () => ({ status: "not_run" as const, last_run_at: null, discrepancies: [] }),
          onSome: (r) => ({
            status: Schema.is(ReconciliationStatus)(r.status) ? r.status : ("failed" as const),
            last_run_at: r.finished_at,
            discrepancies: r.discrepancies.slice(0, 10)
          })
        })
      )

      const probe = <A, E>(effect: Effect.Effect<A, E>) =>
        effect.pipe(
          Effect.timeout("2 seconds"),
          Effect.match({
            onFailure: (e) => ({ status: "down" as const, detail: String(e).slice(0, 200) }),
            onSuccess: () => ({ status: "up" as const })
          })
        )

      const check = Effect.gen(function* () {
        const [database, chainState, recon] = yield* Effect.all(
          [probe(sql`SELECT 1`), probe(chain.blockNumber()), reconciliation],
          { concurrency: "unbounded" }
        )
        const reconciliationBlocks = config.mainnet && recon.status === "failed"
        const ready = database.status === "up" && chainState.status === "up" && !reconciliationBlocks
        return {
          status: ready ? ("ready" as const) : ("not_ready" as const),
          database,
          chain: chainState,
          reconciliation: recon
        }
      }).pipe(Effect.withSpan("Readiness.check"))

      const refreshGauges = Effect.gen(function* () {
        const recon = yield* reconciliation
        yield* Metric.update(reconciliationOk, recon.status === "ok" ? 1 : 0)
        yield* Metric.update(reconciliationTimestamp, recon.last_run_at ?? 0)
      }).pipe(Effect.catchCause(() => Effect.void))

      return Readiness.of({ check, refreshGauges })
    })
  )
}
