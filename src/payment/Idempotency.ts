import { createHash } from "node:crypto"
import { Context, Effect, Layer, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import type { LeftByDead } from "../db/Instances.ts"
import { Conflict } from "../domain/Errors.ts"
import { traced } from "../Telemetry.ts"

export type Claim = { readonly _tag: "Fresh" } | { readonly _tag: "Replay"; readonly requestId: string }

export const bodyHash = (body: unknown) => createHash("sha256").update(JSON.stringify(body)).digest("hex")

/**
 * `Idempotency-Key` on paid calls, enforced by the database across instances: the first
 * request with a key owns it; the same key and body afterwards replays the original
 * result (never a second charge or provider call); a different body, or a duplicate while
 * the first is still running, is a 409. A key whose request failed before anything was
 * reserved is freed, so the client can retry it (for example after a 402).
 *
 * A fresh claim is a scoped resource: taken and its release registered in one uninterruptible
 * step, and released with its scope whatever ends it (success, failure, a hang-up, shutdown). The
 * release frees the key unless the request completed it with its request id first, so an
 * interrupted request never leaves its key `in_progress` for every retry to meet a 409.
 */
export class Idempotency extends Context.Service<
  Idempotency,
  {
    /** Claims the key for the life of the scope (see above); `Replay` holds nothing. */
    readonly claim: (key: string, hash: string) => Effect.Effect<Claim, Conflict, Scope.Scope>
    /** Marks the key done with the request that answered it: the scope's release then keeps it. */
    readonly complete: (key: string, requestId: string) => Effect.Effect<void>
    /** Forgets keys older than a day (each holds a hash of its body). */
    readonly expire: Effect.Effect<void>
    /**
     * Frees the claims dead instances held (their releases never ran): each key's next request runs
     * afresh instead of meeting a 409 for a day; those `leftByDead` holds for (a resumed instance's own are
     * kept, D563). Returns how many were freed.
     */
    readonly releaseClaimsOf: (
      instances: ReadonlyArray<string>,
      leftByDead: LeftByDead
    ) => Effect.Effect<number>
  }
>()("router/payment/Idempotency") {
  static readonly layer = Layer.effect(
    Idempotency,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient

      const claimOnce = Effect.fnUntraced(function* (
        key: string,
        hash: string
      ): Effect.fn.Return<Claim, Conflict> {
        const inserted = yield* sql`
          INSERT INTO idempotency_keys (key, body_hash, state) VALUES (${key}, ${hash}, 'in_progress')
          ON CONFLICT (key) DO NOTHING RETURNING key
        `.pipe(Effect.orDie)
        if (inserted.length > 0) return { _tag: "Fresh" } as const
        const rows = yield* sql<{ body_hash: string; request_id: string | null; state: string }>`
          SELECT body_hash, request_id, state FROM idempotency_keys WHERE key = ${key}
        `.pipe(Effect.orDie)
        const row = rows[0]
        if (row === undefined) return yield* claimOnce(key, hash)
        if (row.body_hash !== hash) {
          return yield* new Conflict({
            code: "idempotency_replay",
            param: "Idempotency-Key",
            message: "This Idempotency-Key was used with a different request body"
          })
        }
        if (row.state !== "done" || row.request_id === null) {
          return yield* new Conflict({
            code: "idempotency_replay",
            param: "Idempotency-Key",
            message: "A request with this Idempotency-Key is still in progress"
          })
        }
        return { _tag: "Replay", requestId: row.request_id } as const
      }, traced("Idempotency.claim"))

      const complete = (key: string, requestId: string) =>
        sql`UPDATE idempotency_keys SET state = 'done', request_id = ${requestId} WHERE key = ${key}`.pipe(
          Effect.asVoid,
          Effect.orDie
        )
      const abandon = (key: string) =>
        sql`DELETE FROM idempotency_keys WHERE key = ${key} AND state = 'in_progress'`.pipe(
          Effect.asVoid,
          Effect.orDie
        )

      const claim = (key: string, hash: string) =>
        Effect.acquireRelease(claimOnce(key, hash), (claimed) =>
          claimed._tag === "Fresh" ? abandon(key) : Effect.void
        )

      const expire = sql`DELETE FROM idempotency_keys WHERE created_at < now() - interval '1 day'`.pipe(
        Effect.asVoid,
        Effect.orDie
      )

      const releaseClaimsOf = (instances: ReadonlyArray<string>, leftByDead: LeftByDead) =>
        instances.length === 0
          ? Effect.succeed(0)
          : sql`DELETE FROM idempotency_keys
                WHERE state = 'in_progress' AND instance_id IN ${sql.in(instances)}
                  AND EXISTS (SELECT 1 FROM router_instances
                              WHERE ${leftByDead(sql`idempotency_keys.instance_id`, sql`idempotency_keys.created_at`)})
                RETURNING key`.pipe(
              Effect.map((rows) => rows.length),
              Effect.orDie
            )

      return Idempotency.of({ claim, complete, expire, releaseClaimsOf })
    })
  )
}
