import { randomBytes } from "node:crypto"
import { Config, Context, Effect, Layer } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { repeatInBackground } from "../Background.ts"
import { elapsedMs } from "../process/ElapsedClock.ts"

/**
 * This process's instance id. Every database connection names it in `application_name`
 * (`svc-router/<id>`), so what the instance writes (capacity leases, reservations) carries it.
 */
export const INSTANCE_ID = `i_${randomBytes(6).toString("hex")}`
export const applicationName = `svc-router/${INSTANCE_ID}`

/**
 * A condition on a row another instance wrote: `instanceId` names the writer (with `router_instances` in scope,
 * unaliased), `writtenAt` when it wrote it; true when the writer is dead and the row is one it left (D563).
 */
export type LeftByDead = (instanceId: Statement.Fragment, writtenAt: Statement.Fragment) => Statement.Fragment

/** How often an instance says it is alive; an instance silent for `INSTANCE_DEAD_AFTER_SECONDS` is dead. */
const HEARTBEAT = "5 seconds"
const HEARTBEAT_SECONDS = 5
const STALL_GAP_SECONDS = 7.5

/**
 * The router instances on this database (D154): each registers itself at start, beats every five
 * seconds and marks itself stopped at its end. An instance that stopped, or whose heartbeat lags this
 * instance's own by `INSTANCE_DEAD_AFTER_SECONDS` (30 s; D252), is dead: its capacity leases are released
 * at once and its open reservations settled by a survivor (`inference/Reaper.ts`), instead of
 * waiting out the 20-minute lease TTL and reaping age.
 */
export class Instances extends Context.Service<
  Instances,
  {
    readonly self: string
    readonly deadAfterSeconds: number
    /**
     * Dead instances whose leftovers are not settled yet: never marked settled, or marked so and holding a lease
     * or an open reservation since (written after resuming, before it died again, or committed after the pass
     * that marked it, D563).
     */
    readonly dead: Effect.Effect<ReadonlyArray<string>>
    /**
     * Deletes the capacity leases the given instances wrote before they fell silent, while each is still dead;
     * returns how many. A lease written well after an instance's last beat is a resumed instance's (D561),
     * until the instance has been silent for the dead-after time since it was written (D563).
     */
    readonly releaseLeases: (instanceIds: ReadonlyArray<string>) => Effect.Effect<number>
    /**
     * A condition on a row of the instance `instanceId` names (`router_instances` in scope, unaliased), written
     * at `writtenAt`: the instance is still dead and the row is one it left, by the same cut as
     * `releaseLeases` (D563). Settling a reservation is as much a release as deleting a lease.
     */
    readonly leftByDead: LeftByDead
    /**
     * Records that nothing of these instances is left open (no lease, no open reservation), for those still
     * dead: one that beat meanwhile is visited again when it dies for good, with what it opened since, and one
     * with rows written after the cut is visited until they are settled (D563).
     */
    readonly markSettled: (instanceIds: ReadonlyArray<string>) => Effect.Effect<void>
    /**
     * Since when (`elapsedMs`, D560) this instance's beats have got through with no gap of half
     * `deadAfterSeconds`, +Infinity during such a gap: a capacity lease it wrote since then still has its
     * row, as no survivor can have declared it dead meanwhile (a warm lease written before is not reused, D557).
     */
    readonly steadySince: (nowMs: number) => number
  }
>()("router/db/Instances") {
  static readonly layer = Layer.effect(
    Instances,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const deadAfterSeconds = yield* Config.Int("INSTANCE_DEAD_AFTER_SECONDS").pipe(Config.withDefault(30))
      // Alive again after a stall long enough to be declared dead: registered afresh, so what it
      // opens from now on is settled if it dies later.
      // A beat that comes more than one and a half intervals after the last one ends a stall of this
      // instance (or of the database): its beats are steady only from then on (D293). A new instance is
      // steady from its first beat, not before (D401): it may have started right after a stall of the
      // database, when every other heartbeat lags until its owner beats again.
      const beat = sql`
        INSERT INTO router_instances (instance_id, beating_since) VALUES (${INSTANCE_ID}, now())
        ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL, settled_at = NULL,
          beating_since = CASE WHEN router_instances.heartbeat_at < now() - make_interval(secs => ${STALL_GAP_SECONDS})
                               THEN now() ELSE router_instances.beating_since END
      `.pipe(Effect.asVoid)
      // The same steadiness as this process sees it (the process itself may have been frozen): a beat that
      // returns more than half the dead-after time after the previous one starts it afresh.
      const gapMs = (deadAfterSeconds * 1000) / 2
      let lastBeatAt = 0
      let steadyFrom = 0
      const beaten = Effect.sync(() => {
        const nowMs = elapsedMs()
        if (nowMs - lastBeatAt > gapMs) steadyFrom = nowMs
        lastBeatAt = nowMs
      })
      const steadySince = (nowMs: number) =>
        nowMs - lastBeatAt > gapMs ? Number.POSITIVE_INFINITY : steadyFrom
      const beatSeen = Effect.tap(beat, () => beaten)
      yield* Effect.acquireRelease(Effect.orDie(beatSeen), () =>
        sql`UPDATE router_instances SET stopped_at = now() WHERE instance_id = ${INSTANCE_ID}`.pipe(
          Effect.ignore
        )
      )
      yield* repeatInBackground(beatSeen, {
        every: HEARTBEAT,
        failure: "instance heartbeat failed",
        level: "warning"
      })

      // Dead: stopped, or silent for `deadAfterSeconds` while this instance's own beats got through. Not
      // "older than now() - deadAfter": after a stall of the database itself (or of this process) every
      // heartbeat is that old, and the survivors would settle each other's requests in flight.
      // And only once this instance's own beats have been steady that long (D293): right after a stall
      // the instance whose beat gets through first would see every other one lag until it beats again.
      const isDead = sql`(stopped_at IS NOT NULL OR heartbeat_at < (
        SELECT self.heartbeat_at - make_interval(secs => ${deadAfterSeconds})
        FROM router_instances self WHERE self.instance_id = ${INSTANCE_ID}
          AND self.beating_since <= self.heartbeat_at - make_interval(secs => ${deadAfterSeconds})))`
      const dead = sql<{ instance_id: string }>`
        SELECT instance_id FROM router_instances
        WHERE instance_id <> ${INSTANCE_ID} AND ${isDead}
          AND (settled_at IS NULL
               OR instance_id IN (SELECT l.instance_id FROM capacity_leases l
                                  UNION SELECT r.instance_id FROM requests r WHERE r.status = 'reserved'))
        ORDER BY heartbeat_at LIMIT 20
      `.pipe(
        Effect.map((rows) => rows.map((r) => r.instance_id)),
        Effect.orDie
      )

      // What a dead instance wrote before it fell silent: up to its next beat, and a slow statement after it.
      // An instance frozen long enough to be judged dead (a stopped VM, a stall of its own) writes again once it
      // resumes, before its next beat says so: those rows, written that long after its last beat, are the leases
      // and reservations of requests it is serving now, and releasing them would let the other instances past
      // the provider's ceiling and leave its capture nothing to capture (D561, D563). The cut is at most the
      // dead-after time, so a row written after it by an instance judged dead is one written after resuming.
      // A row written after the cut by an instance that has since been silent for the dead-after time (while
      // this one's beats got through) was written by an instance that died again: it goes too.
      const cutSeconds = Math.min(Math.max(deadAfterSeconds / 2, 2 * HEARTBEAT_SECONDS), deadAfterSeconds)
      const leftByDead: LeftByDead = (instanceId, writtenAt) => sql`(
        router_instances.instance_id = ${instanceId} AND ${isDead}
        AND (${writtenAt} < router_instances.heartbeat_at + make_interval(secs => ${cutSeconds})
          OR ${writtenAt} < (SELECT self.heartbeat_at - make_interval(secs => ${deadAfterSeconds})
                            FROM router_instances self WHERE self.instance_id = ${INSTANCE_ID})))`
      const releaseLeases = (instanceIds: ReadonlyArray<string>) =>
        sql<{ lease_id: string }>`
          DELETE FROM capacity_leases l USING router_instances
          WHERE l.instance_id IN ${sql.in(instanceIds)} AND ${leftByDead(sql`l.instance_id`, sql`l.acquired_at`)}
          RETURNING l.lease_id
        `.pipe(
          Effect.map((rows) => rows.length),
          Effect.orDie
        )

      const markSettled = (instanceIds: ReadonlyArray<string>) =>
        sql`
          UPDATE router_instances SET settled_at = now()
          WHERE instance_id IN ${sql.in(instanceIds)} AND settled_at IS NULL AND ${isDead}
            AND NOT EXISTS (SELECT 1 FROM capacity_leases l WHERE l.instance_id = router_instances.instance_id)
            AND NOT EXISTS (SELECT 1 FROM requests r
                            WHERE r.status = 'reserved' AND r.instance_id = router_instances.instance_id)
        `.pipe(Effect.asVoid, Effect.orDie)

      return Instances.of({
        self: INSTANCE_ID,
        deadAfterSeconds,
        dead,
        releaseLeases,
        leftByDead,
        markSettled,
        steadySince
      })
    })
  )
}
