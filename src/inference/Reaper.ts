import { Config, Context, Effect, Layer } from "effect"
import { repeatInBackground } from "../Background.ts"
import { Instances } from "../db/Instances.ts"
import { Authorizations } from "../ledger/Authorizations.ts"
import { Ledger } from "../ledger/Ledger.ts"
import { Settle } from "../ledger/Settle.ts"
import { Idempotency } from "../payment/Idempotency.ts"
import { Sessions } from "../payment/Sessions.ts"
import { LiveStreams } from "./LiveStreams.ts"

/**
 * The last line of "no reservation outlives its request": a reservation still open long
 * after any request could have been served belongs to an instance that died mid-request, or
 * to a settlement the background retry gave up on. It is settled from its durable record
 * (`Settle.fromRecord`): what its recorded meter says was delivered is captured, the rest
 * released, a receipt issued; with no record it is released in full (the caller is never
 * charged for work nobody can prove). A request this instance is still serving is never touched.
 */
export class Reaper extends Context.Service<
  Reaper,
  {
    readonly runOnce: Effect.Effect<number>
    /**
     * Settles what dead router instances left open (D154): their capacity leases are deleted, the x402
     * settlements they claimed go back to the queue (D250), their Idempotency-Key claims are freed (D291)
     * and their reservations are settled from their
     * durable records (D211: the delivered charge captured, the rest released, receipts issued), as soon
     * as their heartbeat stops. Returns how many reservations it settled.
     */
    readonly settleDeadInstances: Effect.Effect<number>
    /**
     * Settles from their final records this instance's requests whose settlement the background retry
     * gave up on (D211): the retry goes on from the durable record, every 5 s, instead of waiting for
     * the reaping age. Returns how many it settled.
     */
    readonly settleGivenUp: Effect.Effect<number>
  }
>()("router/inference/Reaper") {
  static readonly make = Effect.gen(function* () {
    const ledger = yield* Ledger
    const idempotency = yield* Idempotency
    const live = yield* LiveStreams
    const sessions = yield* Sessions
    const instances = yield* Instances
    const authorizations = yield* Authorizations
    const settle = yield* Settle
    // Past the serving deadline (15 min) no instance can still be serving it; before the epoch
    // close's 30-minute dead-request rule, so its receipt lands before its epoch closes.
    const afterSeconds = yield* Config.Int("REAP_AFTER_SECONDS").pipe(Config.withDefault(1200))

    const runOnce = Effect.gen(function* () {
      const rows = yield* ledger.staleReservations(afterSeconds)
      const stale = rows.filter((row) => {
        const stream = live.get(row.request_id)
        // A stream that told its readers the end may still be settling (D534): only its work's end counts.
        return stream === undefined || stream.done
      })
      yield* Effect.forEach(stale, settle.fromRecord, { discard: true })
      // Budgets never stay locked: expired sessions nobody closed are settled as if closed,
      // and idempotency keys (a hash of each body) are kept no longer than a day.
      yield* sessions.expireDue
      yield* idempotency.expire
      if (stale.length > 0)
        yield* Effect.logWarning("settled reservations left by a dead request", { count: stale.length })
      return stale.length
    }).pipe(Effect.withSpan("Reaper.runOnce"))

    const settleDeadInstances = Effect.gen(function* () {
      const dead = yield* instances.dead
      if (dead.length === 0) return 0
      const leases = yield* instances.releaseLeases(dead)
      // Settlements they claimed and never finished are offered to the live instances' settlement loop.
      const claims = yield* authorizations.releaseClaimsOf(dead, instances.leftByDead)
      // Idempotency-Key claims they held (D291): a retry of such a key runs afresh, not 409 for a day.
      const keys = yield* idempotency.releaseClaimsOf(dead, instances.leftByDead)
      // Those it left: not the requests of one that resumed and serves them now (D563).
      const open = yield* ledger.reservationsOf(dead, instances.leftByDead)
      // Nothing this instance serves is ever touched (a request id is one instance's only).
      const orphaned = open.filter((row) => live.get(row.request_id) === undefined)
      yield* Effect.forEach(orphaned, settle.fromRecord, { discard: true })
      // A page of 100 at a time: the instances are settled once nothing of theirs is left open (rows written
      // after the cut keep one visited until they go, D563).
      if (open.length < 100) yield* instances.markSettled(dead)
      // Quiet while an instance is only kept visited for rows it wrote after resuming (D563).
      if (leases + claims + keys + orphaned.length === 0) return 0
      yield* Effect.logWarning("settled what dead router instances left open", {
        instances: dead.join(","),
        leases,
        settlements: claims,
        idempotency_keys: keys,
        reservations: orphaned.length
      })
      return orphaned.length
    }).pipe(Effect.withSpan("Reaper.settleDeadInstances"))

    const settleGivenUp = Effect.gen(function* () {
      const rows = yield* ledger.finalRecordsOf(instances.self)
      // A final record is written while serving has ended; one the background retry still holds is its own.
      const givenUp = rows.filter((row) => !settle.inRetry(row.request_id))
      yield* Effect.forEach(givenUp, settle.fromRecord, { discard: true })
      return givenUp.length
    }).pipe(Effect.withSpan("Reaper.settleGivenUp"))

    return Reaper.of({ runOnce, settleDeadInstances, settleGivenUp })
  })

  static readonly layer = Layer.effect(
    Reaper,
    Effect.gen(function* () {
      const reaper = yield* Reaper.make
      yield* repeatInBackground(reaper.runOnce, { every: "1 minute", failure: "reaper pass failed" })
      yield* repeatInBackground(Effect.andThen(reaper.settleDeadInstances, reaper.settleGivenUp), {
        every: "5 seconds",
        failure: "settling dead instances and given-up settlements failed",
        level: "warning"
      })
      return reaper
    })
  )
}
