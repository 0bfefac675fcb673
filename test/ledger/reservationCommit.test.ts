import { randomBytes } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { databaseFromUrl } from "../../src/db/Database.ts"
import { makeCreditFold } from "../../src/ledger/CreditFold.ts"
import { makeReservations, type ReservationRecord } from "../../src/ledger/Reserve.ts"
import { hashSecret } from "../../src/payment/Keys.ts"
import { freshDatabaseUrl } from "../support/Database.ts"
import { fundedKey } from "../support/Keys.ts"

/**
 * D542: a key's or an x402 reservation's commit does not wait for the WAL to reach the disk (it is on every
 * paid call's first-byte path), nor does the credit fold's; a session turn's and everything else's still do. One pool connection, so every statement here runs on
 * one backend and its own WAL writes can be counted.
 */
const OneConnection = Layer.unwrap(Effect.map(freshDatabaseUrl, (url) => databaseFromUrl(url, 1)))

const record = (): Omit<ReservationRecord, "payer"> => ({
  requestId: `req_${randomBytes(8).toString("hex")}`,
  dialect: "openai",
  requestedModel: "chat-small",
  modelClass: "chat-small",
  providerId: "p-commit",
  authorized: 1_000,
  agent: {}
})

/**
 * The test server commits asynchronously for speed (`test/support/globalSetup.ts`); this connection's
 * session waits for the disk as the router's server does.
 */
const durableSession = Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SET synchronous_commit = on`)

/**
 * The paid path's two reservations (a key's, an x402 authorization's), each as a statement that reserves a
 * fresh request every time it runs.
 */
const reservations = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const reserve = makeReservations(sql)
  const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
  const payer = `0x${randomBytes(20).toString("hex")}`
  const named: ReadonlyArray<readonly [string, Effect.Effect<void, unknown>]> = [
    [
      "a key's",
      Effect.suspend(() =>
        Effect.asVoid(reserve.reserveCreditKey(record(), hashSecret(key.secret), Date.now()))
      )
    ],
    [
      "an x402 authorization's",
      Effect.suspend(() =>
        Effect.asVoid(
          reserve.reserveX402(
            { ...record(), payer },
            {
              nonce: `0x${randomBytes(32).toString("hex")}`,
              validAfter: 0n,
              validBefore: 2n ** 40n,
              signature: `0x${"11".repeat(65)}`,
              balance: 1_000_000n
            }
          )
        )
      )
    ]
  ]
  return named
})

/**
 * A session turn's reservation, which waits for the disk: the turn's claim on its session is committed before
 * it, and must not point at a reservation a crash could lose.
 */
const sessionTurn = Effect.gen(function* () {
  const reserve = makeReservations(yield* SqlClient.SqlClient)
  const payer = `0x${randomBytes(20).toString("hex")}`
  return Effect.suspend(() => reserve.reserveSessionTurn({ ...record(), payer, sessionId: "sess_commit" }))
})

const currentSetting = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ setting: string }>`SELECT current_setting('synchronous_commit') AS setting`,
    (rows) => rows[0]!.setting
  )
)

/**
 * This backend's own WAL writes, where the server counts them per backend (PostgreSQL 18 on): a commit that
 * waits for the disk writes the WAL out itself (and flushes it, where `fsync` is on; the test server runs
 * with it off), an asynchronous one leaves that to the WAL writer.
 */
const ownWalWrites = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [{ version }] = yield* sql<{
    version: number
  }>`SELECT current_setting('server_version_num')::int AS version`
  if (version < 180_000) return undefined
  yield* sql`SELECT pg_stat_force_next_flush()`
  const rows = yield* sql<{ writes: string }>`
    SELECT coalesce(sum(writes), 0)::text AS writes FROM pg_stat_get_backend_io(pg_backend_pid()) WHERE object = 'wal'`
  return Number(rows[0]!.writes)
})

/**
 * The fewest WAL writes of this backend's own that `run` made, over up to three runs (stopping at one that
 * made none). A backend also writes the WAL out when the shared WAL buffers are full, which the other test
 * files' databases and migrations can cause at any moment; a commit that waits writes every time, so a
 * statement that commits that way never reaches zero.
 */
const fewestOwnWalWrites = (
  run: Effect.Effect<unknown, unknown, SqlClient.SqlClient>,
  prepare: Effect.Effect<unknown, unknown, SqlClient.SqlClient> = Effect.void
) =>
  Effect.gen(function* () {
    let fewest = Number.POSITIVE_INFINITY
    for (let attempt = 0; attempt < 3 && fewest > 0; attempt++) {
      yield* prepare
      const before = (yield* ownWalWrites)!
      yield* run
      fewest = Math.min(fewest, (yield* ownWalWrites)! - before)
    }
    return fewest
  })

/** The most WAL writes of this backend's own that `run` made, over up to three runs (stopping at one that made some). */
const mostOwnWalWrites = (run: Effect.Effect<unknown, unknown, SqlClient.SqlClient>) =>
  Effect.gen(function* () {
    let most = 0
    for (let attempt = 0; attempt < 3 && most === 0; attempt++) {
      const before = (yield* ownWalWrites)!
      yield* run
      most = Math.max(most, (yield* ownWalWrites)! - before)
    }
    return most
  })

describe("the commits that do not wait for the disk (D542)", () => {
  layer(OneConnection, { timeout: 60_000 })((it) => {
    it.effect(
      "a paid reservation runs with synchronous_commit off in its own transaction, and only there",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          yield* durableSession
          for (const [name, reserve] of yield* reservations) {
            // Inside a transaction the setting the statement made lasts to that transaction's end.
            const inside = yield* sql.withTransaction(Effect.andThen(reserve, currentSetting))
            assert.strictEqual(inside, "off", `${name} reservation`)
            assert.strictEqual(yield* currentSetting, "on", `after ${name} reservation`)
          }
          const turn = yield* sessionTurn
          assert.strictEqual(
            yield* sql.withTransaction(Effect.andThen(turn, currentSetting)),
            "on",
            "a session turn's reservation waits"
          )
        })
    )

    it.effect(
      "a reservation or a fold commits without writing the WAL out, while an ordinary write still does",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          yield* durableSession
          const started = yield* ownWalWrites
          if (started === undefined) {
            // Before PostgreSQL 18 a backend's own WAL writes are not counted apart from the WAL writer's;
            // the test above still shows the setting in force.
            return
          }
          for (const [name, reserve] of yield* reservations) {
            assert.strictEqual(
              yield* fewestOwnWalWrites(reserve),
              0,
              `${name} reservation wrote the WAL out itself`
            )
          }
          // The credit fold: each time a key's reservation of 1,000 captured at 400, queued as a capture queues it.
          const key = yield* fundedKey({ budget: 1_000_000, balance: 1_000_000 })
          const queue = Effect.gen(function* () {
            const queued = record()
            yield* makeReservations(sql).reserveCreditKey(queued, hashSecret(key.secret), Date.now())
            yield* sql`INSERT INTO credit_unfolded (request_id, key_id, wallet, authorized, charged)
                       VALUES (${queued.requestId}, ${key.keyId}, ${key.wallet}, 1000, 400)`
          })
          let folds = 0
          const fold = Effect.map(makeCreditFold(sql).foldNow, (folded) => {
            folds++
            assert.strictEqual(folded, 1)
          })
          assert.strictEqual(yield* fewestOwnWalWrites(fold, queue), 0, "the fold wrote the WAL out itself")
          const [folded] = yield* sql<{ spent: string; reserved: string }>`
            SELECT spent::text, reserved::text FROM api_keys WHERE key_id = ${key.keyId}`
          assert.deepStrictEqual(folded, { spent: String(400 * folds), reserved: "0" })
          // The control: a write of the same connection that is neither waits for the disk.
          const ordinary = Effect.suspend(
            () =>
              sql`INSERT INTO wallets (wallet, invited) VALUES (${`0x${randomBytes(20).toString("hex")}`}, false)`
          )
          assert.isAbove(yield* mostOwnWalWrites(ordinary), 0, "an ordinary commit writes the WAL out itself")
          assert.isAbove(
            yield* mostOwnWalWrites(yield* sessionTurn),
            0,
            "a session turn's reservation writes the WAL out itself"
          )
        })
    )
  })
})
