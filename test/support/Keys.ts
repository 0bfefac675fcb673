import { createHash, randomBytes } from "node:crypto"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * A funded key written straight into the book (the key-management API has its own tests):
 * an invited wallet with `balance` base units of credit and a spend-capable key capped at
 * `budget`. Returns the secret to send as `x-credit-key`.
 */
export const fundedKey = (options: { budget: number; balance: number; wallet?: string }) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const wallet = (options.wallet ?? `0x${randomBytes(20).toString("hex")}`).toLowerCase()
    const secret = `svc_ck_${randomBytes(24).toString("base64url")}`
    const keyId = `key_${randomBytes(8).toString("hex")}`
    yield* sql`INSERT INTO wallets (wallet, invited) VALUES (${wallet}, true)
               ON CONFLICT (wallet) DO UPDATE SET invited = true`
    yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${wallet}, ${options.balance})
               ON CONFLICT (wallet) DO UPDATE SET available = ${options.balance}, reserved = 0`
    yield* sql`INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget)
               VALUES (${keyId}, ${wallet}, 'test', 'credit',
                       ${createHash("sha256").update(secret).digest("hex")}, ${options.budget})`
    return { secret, keyId, wallet }
  }).pipe(Effect.orDie)

/** A key's figures and its owner's balance as readers see them: captures not yet folded counted (D315). */
export const keyState = (keyId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{
      budget: string
      spent: string
      reserved: string
      available: string
      wallet_reserved: string
    }>`
      SELECT k.budget::text, f.spent::text, f.reserved::text, w.available::text, w.reserved::text AS wallet_reserved
      FROM api_keys k JOIN key_figures f ON f.key_id = k.key_id JOIN balance_figures w ON w.wallet = k.wallet
      WHERE k.key_id = ${keyId}
    `
    const row = rows[0]!
    return {
      budget: Number(row.budget),
      spent: Number(row.spent),
      reserved: Number(row.reserved),
      available: Number(row.available),
      walletReserved: Number(row.wallet_reserved)
    }
  }).pipe(Effect.orDie)

/**
 * The key's and its owner's rows themselves (what the fold has applied, D315) and how many credit captures
 * are still queued for it (all keys).
 */
export const keyRows = (keyId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{
      queued: number
      spent: string
      reserved: string
      available: string
      wallet_reserved: string
    }>`
      SELECT (SELECT count(*)::int FROM credit_unfolded) AS queued, k.spent::text, k.reserved::text,
             w.available::text, w.reserved::text AS wallet_reserved
      FROM api_keys k JOIN wallet_balances w ON w.wallet = k.wallet WHERE k.key_id = ${keyId}
    `
    const row = rows[0]!
    return {
      queued: row.queued,
      spent: Number(row.spent),
      reserved: Number(row.reserved),
      available: Number(row.available),
      walletReserved: Number(row.wallet_reserved)
    }
  }).pipe(Effect.orDie)

/**
 * `keyState` once none of the key's requests is still `reserved`: a reply can reach its caller before the
 * statement that settles it commits (D534), so a test that reads the figures its answers left waits here.
 */
export const keySettled = (keyId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    for (let i = 0; i < 200; i++) {
      const rows = yield* sql<{ n: number }>`
        SELECT count(*)::int AS n FROM requests WHERE key_id = ${keyId} AND status = 'reserved'`
      if (rows[0]!.n === 0) return yield* keyState(keyId)
      yield* Effect.sleep("50 millis")
    }
    return yield* Effect.die(new Error(`key ${keyId} still has reserved requests after 10 s`))
  }).pipe(Effect.orDie)
