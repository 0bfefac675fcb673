import { createHash } from "node:crypto"
import { Clock, Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { type Hex, recoverMessageAddress } from "viem"
import { Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import { ClaimView, type SignedClaim } from "../domain/Integrity.ts"
import { Providers } from "../market/Providers.ts"
import { QuoteBook } from "../market/QuoteBook.ts"

/** A claim is accepted up to 300 s after `signed_at` and 5 s before it. */
export const CLAIM_WINDOW_S = 300
const CLAIM_SKEW_S = 5

/** The exact EIP-191 message the provider's registered signer signs. */
export const claimSigningString = (claim: Omit<SignedClaim, "sig">) =>
  [
    "svc model-integrity claim",
    `provider_id: ${claim.provider_id}`,
    `model_class: ${claim.model_class}`,
    `model: ${claim.model}`,
    `bond_amount: ${claim.bond_amount}`,
    `signed_at: ${claim.signed_at}`
  ].join("\n")

const decodeRows = Schema.decodeUnknownEffect(Schema.Array(ClaimView))

export type ClaimRefusal = InvalidRequest | Unauthorized | Forbidden | Conflict

/**
 * Model claims (docs/decisions.md D67): signed by the provider's registered key like its quotes, one
 * active claim per (provider, class); a newer signed claim supersedes it, and every claim stays readable.
 */
export class Claims extends Context.Service<
  Claims,
  {
    readonly submit: (claim: SignedClaim) => Effect.Effect<ClaimView, ClaimRefusal>
    readonly get: (claimId: string) => Effect.Effect<ClaimView, NotFound>
    /** The active claim of a provider for a class, if it made one. */
    readonly activeFor: (providerId: string, modelClass: string) => Effect.Effect<string | null>
  }
>()("router/integrity/Claims") {
  static readonly layer = Layer.effect(
    Claims,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const providers = yield* Providers
      const book = yield* QuoteBook

      /** Rows in the wire shape (amounts as float8: exact integers below 2^53). */
      const select = (where: Statement.Fragment) =>
        sql`
          SELECT claim_id AS id, 'model_integrity_claim' AS object, provider_id, model_class, model,
                 bond_amount::float8 AS bond_amount, 'metadata' AS bond_kind, status, signed_at::float8 AS signed_at,
                 signer, signature, floor(extract(epoch FROM created_at))::float8 AS created_at,
                 floor(extract(epoch FROM superseded_at))::float8 AS superseded_at
          FROM integrity_claims WHERE ${where}
        `.pipe(Effect.flatMap(decodeRows), Effect.orDie)

      const checkProvider = Effect.fn("Claims.checkProvider")(function* (claim: SignedClaim) {
        const provider = providers.get(claim.provider_id)
        if (provider === undefined || !provider.enabled) {
          return yield* new Forbidden({
            code: provider === undefined ? "provider_not_registered" : "provider_disabled",
            param: "provider_id",
            message: `Provider ${claim.provider_id} is ${provider === undefined ? "not registered" : "disabled"}`
          })
        }
        const live = yield* book.live
        if (
          !live.some(
            (q) => q.quote.provider_id === claim.provider_id && q.quote.model_class === claim.model_class
          )
        ) {
          return yield* new InvalidRequest({
            code: "class_not_quoted",
            param: "model_class",
            message: `Provider ${claim.provider_id} has no live quote for ${claim.model_class}; a claim covers a class it quotes`
          })
        }
        const nowSeconds = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        if (claim.signed_at > nowSeconds + CLAIM_SKEW_S || nowSeconds - claim.signed_at > CLAIM_WINDOW_S) {
          return yield* new InvalidRequest({
            code: claim.signed_at > nowSeconds ? "claim_not_yet_valid" : "claim_expired",
            param: "signed_at",
            message: `signed_at must be within ${CLAIM_WINDOW_S} s before the router clock; sign the claim again`
          })
        }
        const { sig, ...unsigned } = claim
        const recovered = yield* Effect.tryPromise(() =>
          recoverMessageAddress({ message: claimSigningString(unsigned), signature: sig as Hex })
        ).pipe(Effect.orElseSucceed(() => "0x"))
        if (recovered.toLowerCase() !== provider.signer.toLowerCase()) {
          return yield* new Unauthorized({
            code: "invalid_signature",
            param: "sig",
            message: "The claim is not signed by the provider's registered signer"
          })
        }
        return provider.signer
      })

      const submit = Effect.fn("Claims.submit")(function* (claim: SignedClaim) {
        const signer = yield* checkProvider(claim)
        const { sig, ...unsigned } = claim
        const claimId = `clm_${createHash("sha256").update(claimSigningString(unsigned)).digest("hex").slice(0, 24)}`
        const stale = () =>
          new Conflict({
            code: "claim_stale",
            param: "signed_at",
            message: `A newer claim for ${claim.model_class} is active; sign this one again to replace it`
          })
        const recorded = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const [same] = yield* select(sql`claim_id = ${claimId}`)
              // The identical signed claim again: the record it made (never re-activated).
              if (same !== undefined) return same
              const active = yield* sql<{ signed_at: string }>`
                SELECT signed_at::text FROM integrity_claims
                WHERE provider_id = ${claim.provider_id} AND model_class = ${claim.model_class} AND status = 'active'
                FOR UPDATE
              `
              if (active[0] !== undefined && Number(active[0].signed_at) > claim.signed_at) {
                return yield* stale()
              }
              yield* sql`
                UPDATE integrity_claims SET status = 'superseded', superseded_at = now()
                WHERE provider_id = ${claim.provider_id} AND model_class = ${claim.model_class} AND status = 'active'
              `
              yield* sql`
                INSERT INTO integrity_claims (claim_id, provider_id, model_class, model, bond_amount, signed_at,
                                              signer, signature, status)
                VALUES (${claimId}, ${claim.provider_id}, ${claim.model_class}, ${claim.model}, ${claim.bond_amount},
                        ${claim.signed_at}, ${signer}, ${sig.toLowerCase()}, 'active')
              `
              return (yield* select(sql`claim_id = ${claimId}`))[0]!
            })
          )
          .pipe(
            Effect.catchTag("SqlError", (error) => {
              if (error.reason._tag !== "UniqueViolation") return Effect.die(error)
              // The identical claim posted twice at once: the record the first one made.
              if (error.reason.constraint === "integrity_claims_pkey") {
                return Effect.map(select(sql`claim_id = ${claimId}`), (rows) => rows[0]!)
              }
              // Two new claims for one class at once: the index keeps one active; the other re-signs.
              return Effect.fail(stale())
            })
          )
        return recorded
      })

      const get = Effect.fn("Claims.get")(function* (claimId: string) {
        const [row] = yield* select(sql`claim_id = ${claimId}`)
        if (row === undefined) {
          return yield* new NotFound({
            code: "claim_not_found",
            message: `No model-integrity claim ${claimId}`
          })
        }
        return row
      })

      const activeFor = Effect.fn("Claims.activeFor")(function* (providerId: string, modelClass: string) {
        const rows = yield* sql<{ claim_id: string }>`
          SELECT claim_id FROM integrity_claims
          WHERE provider_id = ${providerId} AND model_class = ${modelClass} AND status = 'active'
        `.pipe(Effect.orDie)
        return rows[0]?.claim_id ?? null
      })

      return Claims.of({ submit, get, activeFor })
    })
  )
}
