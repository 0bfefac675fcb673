import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import type { ChallengerView } from "../domain/Integrity.ts"

const Row = Schema.Struct({
  status: Schema.Literals(["approved", "revoked"]),
  updated_at: Schema.NumberFromString
})
const decodeRows = Schema.decodeUnknownEffect(Schema.Array(Row))

/**
 * Approved challengers (docs/decisions.md D68): the operator approves or revokes a wallet; only an
 * approved wallet may file. Revoking stops new filings; challenges already open run to their verdict.
 */
export class Challengers extends Context.Service<
  Challengers,
  {
    readonly set: (wallet: string, approved: boolean) => Effect.Effect<ChallengerView>
    readonly status: (wallet: string) => Effect.Effect<ChallengerView>
  }
>()("router/integrity/Challengers") {
  static readonly layer = Layer.effect(
    Challengers,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient

      const status = Effect.fn("Challengers.status")(function* (wallet: string) {
        const id = wallet.toLowerCase()
        const [row] = yield* sql`
          SELECT status, extract(epoch FROM updated_at)::bigint::text AS updated_at
          FROM integrity_challengers WHERE wallet = ${id}
        `.pipe(Effect.flatMap(decodeRows), Effect.orDie)
        return {
          object: "model_integrity_challenger" as const,
          wallet: id,
          status: row?.status ?? ("not_approved" as const),
          approved: row?.status === "approved",
          updated_at: row?.updated_at ?? null
        }
      })

      const set = Effect.fn("Challengers.set")(function* (wallet: string, approved: boolean) {
        yield* sql`
          INSERT INTO integrity_challengers (wallet, status) VALUES (${wallet.toLowerCase()},
            ${approved ? "approved" : "revoked"})
          ON CONFLICT (wallet) DO UPDATE SET status = EXCLUDED.status, updated_at = now()
        `.pipe(Effect.orDie)
        return yield* status(wallet)
      })

      return Challengers.of({ set, status })
    })
  )
}
