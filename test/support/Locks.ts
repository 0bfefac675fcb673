import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Runs `lock` (a statement that takes a lock) in a transaction of its own on another connection, and holds
 * that transaction open until the returned effect lets it go (and waits until it is gone); the current
 * scope's end lets it go too. For tests that hold up the router's statements behind a real lock.
 */
export const holdInTransaction = <E, R>(lock: Effect.Effect<unknown, E, R>) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const held = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.forkScoped(
      sql.withTransaction(
        Effect.gen(function* () {
          yield* lock
          yield* Deferred.succeed(held, undefined)
          yield* Deferred.await(release)
        })
      )
    )
    yield* Deferred.await(held)
    return Deferred.succeed(release, undefined).pipe(Effect.andThen(Fiber.join(holder)), Effect.orDie)
  })
