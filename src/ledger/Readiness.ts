import { Context, Effect, Fiber, Layer, Metric, Option, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { Chain } from "../chain/Chain.ts"
import { type Readiness as ReadinessBody, ReconciliationStatus } from "../domain/System.ts"
import { Drain } from "../process/Drain.ts"
import { RouterConfig } from "../RouterConfig.ts"

export const reconciliationOk = Metric.gauge("svc_reconciliation_ok", {
  description: "1 when the last ledger/chain reconciliation passed, else 0"
})

export const reconciliationTimestamp = Metric.gauge("svc_reconciliation_last_run_timestamp_seconds", {
  description: "Unix time of the last finished reconciliation run (0 when none)"
})

/** Each dependency gets this long; `/ready` answers within it even while the database or the chain hangs. */
const PROBE_TIMEOUT = "2 seconds"

/**
 * `effect` within `PROBE_TIMEOUT`, else `orElse`. It runs in a fiber of its own whose interruption is not
 * awaited: a query on a stalled database cannot be interrupted promptly (its cancel request also stalls).
 */
const bounded =
  <B>(orElse: () => B) =>
  <A>(effect: Effect.Effect<A>) =>
    Effect.flatMap(Effect.forkDetach(effect), (fiber) =>
      Fiber.join(fiber).pipe(
        Effect.timeoutOrElse({
          duration: PROBE_TIMEOUT,
          orElse: () => Effect.as(Effect.forkDetach(Fiber.interrupt(fiber)), orElse())
        })
      )
    )

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
      const drain = yield* Drain

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

      // The last answer read, shown again while the database does not answer in time.
      let lastKnown: ReadinessBody["reconciliation"] = {
        status: "not_run",
        last_run_at: null,
        discrepancies: []
      }
      const reconciliation = Effect.map(lastRun, (row) =>
        Option.match(row, {
          onNone: () => ({ status: "not_run" as const, last_run_at: null, discrepancies: [] }),
          onSome: (r) => ({
            status: Schema.is(ReconciliationStatus)(r.status) ? r.status : ("failed" as const),
            last_run_at: r.finished_at,
            discrepancies: r.discrepancies.slice(0, 10)
          })
        })
      ).pipe(
        Effect.tap((known) =>
          Effect.sync(() => {
            lastKnown = known
          })
        ),
        Effect.matchCause({ onFailure: () => lastKnown, onSuccess: (known) => known }),
        bounded(() => lastKnown)
      )

      const probe = <A, E>(effect: Effect.Effect<A, E>) =>
        effect.pipe(
          Effect.match({
            onFailure: (e) => ({ status: "down" as const, detail: String(e).slice(0, 200) }),
            onSuccess: () => ({ status: "up" as const })
          }),
          bounded(() => ({ status: "down" as const, detail: `no answer within ${PROBE_TIMEOUT}` }))
        )

      const check = Effect.gen(function* () {
        const [database, chainState, recon] = yield* Effect.all(
          [probe(sql`SELECT 1`), probe(chain.probe()), reconciliation],
          { concurrency: "unbounded" }
        )
        const reconciliationBlocks = config.mainnet && recon.status === "failed"
        const ready = database.status === "up" && chainState.status === "up" && !reconciliationBlocks
        return {
          status: drain.isDraining()
            ? ("draining" as const)
            : ready
              ? ("ready" as const)
              : ("not_ready" as const),
          database,
          chain: chainState,
          reconciliation: recon
        }
      }).pipe(Effect.withSpan("Readiness.check"))

      // The gauges say what the last finished run found: a run in progress (every few minutes, for as long as it
      // reads the chain) does not turn them to 0, which a monitor would take for a failed reconciliation.
      const lastFinished = sql<{ status: string; finished_at: number | null }>`
        SELECT status, extract(epoch from finished_at)::float8 AS finished_at
        FROM reconciliation_runs WHERE status <> 'running' ORDER BY id DESC LIMIT 1
      `
      const refreshGauges = Effect.gen(function* () {
        const [last] = yield* lastFinished
        yield* Metric.update(reconciliationOk, last?.status === "ok" ? 1 : 0)
        yield* Metric.update(reconciliationTimestamp, last?.finished_at ?? 0)
      }).pipe(
        Effect.catchCause(() => Effect.void),
        bounded(() => undefined)
      )

      return Readiness.of({ check, refreshGauges })
    })
  )
}
