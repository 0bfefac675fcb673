/**
 * Credit keys written straight into the router's database, as an operator seeding a bench run would.
 */
import { randomBytes } from "node:crypto"
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { hashSecret } from "../../src/payment/Keys.ts"

export interface FundedKey {
  readonly keyId: string
  readonly wallet: string
  readonly secret: string
  readonly amount: number
}

const run = (databaseUrl: string, effect: Effect.Effect<void, unknown, SqlClient.SqlClient>) =>
  Effect.runPromise(
    effect.pipe(
      Effect.provide(PgClient.layer({ url: Redacted.make(databaseUrl) })),
      Effect.scoped,
      Effect.orDie
    )
  )

/** A credit key of `wallet` with a budget of `amount`, spending the wallet's balance as it stands. */
export const insertCreditKey = async (
  databaseUrl: string,
  options: { readonly keyId: string; readonly wallet: string; readonly amount: number }
): Promise<FundedKey> => {
  const secret = `svc_ck_bench_${randomBytes(12).toString("hex")}`
  const { keyId, wallet, amount } = options
  await run(
    databaseUrl,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql`INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget)
                 VALUES (${keyId}, ${wallet}, 'bench', 'credit', ${hashSecret(secret)}, ${amount})`
    })
  )
  return { keyId, wallet, secret, amount }
}

/** The wallet invited and its balance set to `amount` (not backed on chain: a bench of the paid path), and a key. */
export const fundCreditKey = async (
  databaseUrl: string,
  options: { readonly keyId: string; readonly wallet: string; readonly amount: number }
): Promise<FundedKey> => {
  const { wallet, amount } = options
  await run(
    databaseUrl,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql`INSERT INTO wallets (wallet, invited) VALUES (${wallet}, true) ON CONFLICT DO NOTHING`
      yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${wallet}, ${amount})
                 ON CONFLICT (wallet) DO UPDATE SET available = ${amount}`
    })
  )
  return insertCreditKey(databaseUrl, options)
}
