/**
 * A funded credit key written straight into the router's database, as an operator seeding a bench run
 * would: the wallet invited, its balance and the key's budget both `amount` base units.
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

export const fundCreditKey = async (
  databaseUrl: string,
  options: { readonly keyId: string; readonly wallet: string; readonly amount: number }
): Promise<FundedKey> => {
  const secret = `svc_ck_bench_${randomBytes(12).toString("hex")}`
  const { keyId, wallet, amount } = options
  await Effect.runPromise(
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql`INSERT INTO wallets (wallet, invited) VALUES (${wallet}, true) ON CONFLICT DO NOTHING`
      yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${wallet}, ${amount})
                 ON CONFLICT (wallet) DO UPDATE SET available = ${amount}`
      yield* sql`INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget)
                 VALUES (${keyId}, ${wallet}, 'bench', 'credit', ${hashSecret(secret)}, ${amount})`
    }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(databaseUrl) })), Effect.scoped)
  )
  return { keyId, wallet, secret, amount }
}
