import { randomBytes } from "node:crypto"
import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type SqlError, type Statement } from "effect/sql"
import {
  Conflict,
  type FeatureGated,
  Forbidden,
  InvalidRequest,
  NotFound,
  Unauthorized
} from "../domain/Errors.ts"
import {
  AdminChallengeView,
  type ChallengeFiling,
  type ChallengeQuote,
  ChallengeView,
  MAX_EVIDENCE_BYTES
} from "../domain/Integrity.ts"
import { Ledger } from "../ledger/Ledger.ts"
import { baseEarn, bountyOf, challengeStake, MIN_CHALLENGE_STAKE, slashOf } from "../points/Earn.ts"
import { Points, type Verdict } from "../points/Points.ts"
import { isSignedBy } from "../points/WalletSignature.ts"
import { Challengers } from "./Challengers.ts"
import { Claims } from "./Claims.ts"
import { evidenceHash, evidenceText } from "./Evidence.ts"
import { challengesGated, IntegrityConfig } from "./IntegrityConfig.ts"
import {
  MODEL_CHALLENGE_DOMAIN,
  MODEL_CHALLENGE_PURPOSE,
  modelChallengeDigest,
  modelChallengeTypedData
} from "./ModelChallenge.ts"

const decodeRows = Schema.decodeUnknownEffect(Schema.Array(AdminChallengeView))
const decodeView = Schema.decodeUnknownEffect(ChallengeView)

export type FilingRefusal = FeatureGated | InvalidRequest | Unauthorized | Forbidden | NotFound | Conflict

/** The two constraints a filing can meet: one live challenge per receipt, one challenge per signed filing. */
const filingConflict = (error: SqlError.SqlError): Effect.Effect<never, Conflict> => {
  const constraint = error.reason._tag === "UniqueViolation" ? error.reason.constraint : ""
  if (constraint === "integrity_challenges_live") {
    return Effect.fail(
      new Conflict({
        code: "receipt_already_challenged",
        param: "receipt_id",
        message: "This receipt already has an open or upheld challenge"
      })
    )
  }
  if (constraint.includes("filing_digest")) {
    return Effect.fail(
      new Conflict({
        code: "challenge_replayed",
        param: "signature",
        message: "This signed filing already opened a challenge; sign new evidence to file again"
      })
    )
  }
  return Effect.die(error)
}

const receiptNotFound = (id: string) =>
  new NotFound({ code: "receipt_not_found", param: "receipt_id", message: `No receipt ${id}` })

/**
 * The model-integrity challenge machine of spec 3.2 (docs/decisions.md D63): `open` on a signed filing
 * (its stake locks), then the operator's verdict `upheld`, `rejected` or `ambiguous`. At most one
 * open-or-upheld challenge per receipt, by the partial unique index `integrity_challenges_live`.
 */
export class Challenges extends Context.Service<
  Challenges,
  {
    readonly quote: (
      receiptId: string,
      wallet: string | undefined
    ) => Effect.Effect<ChallengeQuote, FeatureGated | NotFound>
    readonly file: (filing: ChallengeFiling) => Effect.Effect<ChallengeView, FilingRefusal>
    readonly verdict: (
      challengeId: string,
      verdict: Verdict,
      note: string | undefined
    ) => Effect.Effect<AdminChallengeView, NotFound | Conflict>
    readonly list: (
      status: ChallengeView["status"] | undefined,
      limit: number
    ) => Effect.Effect<ReadonlyArray<AdminChallengeView>>
  }
>()("router/integrity/Challenges") {
  static readonly layer = Layer.effect(
    Challenges,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const config = yield* IntegrityConfig
      const ledger = yield* Ledger
      const points = yield* Points
      const claims = yield* Claims
      const challengers = yield* Challengers

      const gate = config.challengesEnabled ? Effect.void : Effect.fail(challengesGated())

      /** Rows in the operator's view shape (points as float8: exact integers below 2^53). */
      const select = (where: Statement.Fragment, limit = 1) =>
        sql`
          SELECT challenge_id AS id, 'model_integrity_challenge' AS object, status, receipt_id, wallet, provider_id,
                 model_class, claim_id, evidence_hash, stake::float8 AS stake, slash::float8 AS slash,
                 bounty::float8 AS bounty, floor(extract(epoch FROM created_at))::float8 AS created_at,
                 floor(extract(epoch FROM decided_at))::float8 AS decided_at, evidence::jsonb AS evidence, note
          FROM integrity_challenges WHERE ${where} ORDER BY created_at DESC LIMIT ${limit}
        `.pipe(Effect.flatMap(decodeRows), Effect.orDie)

      const liveChallenge = (receiptId: string) =>
        Effect.map(
          select(sql`receipt_id = ${receiptId} AND status IN ('open', 'upheld')`),
          (rows) => rows[0]?.id ?? null
        )

      const quote = Effect.fn("Challenges.quote")(function* (receiptId: string, wallet: string | undefined) {
        yield* gate
        const found = yield* ledger.receipt(receiptId)
        if (found === undefined) return yield* receiptNotFound(receiptId)
        const receipt = found.body
        const stake = challengeStake(receipt.charged)
        const live = yield* liveChallenge(receiptId)
        const walletTerms =
          wallet === undefined
            ? null
            : yield* Effect.gen(function* () {
                const account = yield* points.account(wallet)
                const status = yield* challengers.status(wallet)
                return {
                  wallet: account.wallet,
                  approved: status.approved,
                  available: account.available,
                  covered: account.available >= stake
                }
              })
        return {
          object: "model_integrity_challenge_quote" as const,
          receipt_id: receipt.request_id,
          provider_id: receipt.provider_id,
          model_class: receipt.model_class,
          claim_id: yield* claims.activeFor(receipt.provider_id, receipt.model_class),
          charged: receipt.charged,
          unit: "points" as const,
          base_earn: baseEarn(receipt.charged),
          minimum_stake: MIN_CHALLENGE_STAKE,
          stake,
          open_to_challenge: live === null,
          live_challenge: live,
          wallet: walletTerms,
          signing: {
            domain: MODEL_CHALLENGE_DOMAIN,
            primary_type: "ModelChallenge" as const,
            purpose: MODEL_CHALLENGE_PURPOSE
          }
        }
      })

      /** Everything a filing must satisfy before it touches the book, in the order it is checked. */
      const checkFiling = Effect.fn("Challenges.checkFiling")(function* (filing: ChallengeFiling) {
        const evidence = { receipt_id: filing.receipt_id, summary: filing.summary, details: filing.details }
        const text = evidenceText(evidence)
        if (Buffer.byteLength(text, "utf8") > MAX_EVIDENCE_BYTES) {
          return yield* new InvalidRequest({
            code: "evidence_too_large",
            param: "details",
            message: `The canonical evidence is at most ${MAX_EVIDENCE_BYTES} bytes`
          })
        }
        const hash = evidenceHash(evidence)
        if (hash !== filing.evidence_hash.toLowerCase()) {
          return yield* new InvalidRequest({
            code: "evidence_hash_mismatch",
            param: "evidence_hash",
            message: `evidence_hash must be the SHA-256 of the canonical JSON of {receipt_id, summary, details}: ${hash}`
          })
        }
        if (filing.purpose !== MODEL_CHALLENGE_PURPOSE) {
          return yield* new InvalidRequest({
            code: "invalid_purpose",
            param: "purpose",
            message: `purpose must be exactly "${MODEL_CHALLENGE_PURPOSE}"`
          })
        }
        const message = { wallet: filing.wallet, receiptId: filing.receipt_id, evidenceHash: hash }
        if (!(yield* isSignedBy(modelChallengeTypedData(message), filing.wallet, filing.signature))) {
          return yield* new Unauthorized({
            code: "invalid_challenge_signature",
            param: "signature",
            message:
              "signature is not a ModelChallenge signed by wallet over this purpose, receipt and evidence"
          })
        }
        const challenger = yield* challengers.status(filing.wallet)
        if (!challenger.approved) {
          return yield* new Forbidden({
            code: "challenger_not_approved",
            param: "wallet",
            message: `${challenger.wallet} is not an approved challenger`
          })
        }
        const found = yield* ledger.receipt(filing.receipt_id)
        if (found === undefined) return yield* receiptNotFound(filing.receipt_id)
        if (found.body.status === "released") {
          return yield* new InvalidRequest({
            code: "receipt_not_served",
            param: "receipt_id",
            message: "Nothing was served on this receipt (status released); there is no model to challenge"
          })
        }
        return { receipt: found.body, text, hash, digest: modelChallengeDigest(message) }
      })

      const file = Effect.fn("Challenges.file")(function* (filing: ChallengeFiling) {
        yield* gate
        const { receipt, text, hash, digest } = yield* checkFiling(filing)
        const wallet = filing.wallet.toLowerCase()
        const stake = challengeStake(receipt.charged)
        const claimId = yield* claims.activeFor(receipt.provider_id, receipt.model_class)
        const id = `chl_${randomBytes(12).toString("hex")}`
        const uncovered = new Forbidden({
          code: "insufficient_points",
          param: "wallet",
          message: `The stake is ${stake} points and more than the wallet's available points (settled minus locked)`
        })
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`
                INSERT INTO integrity_challenges (challenge_id, receipt_id, wallet, provider_id, model_class, claim_id,
                  evidence_hash, evidence, filing_digest, signature, stake, status)
                VALUES (${id}, ${receipt.request_id}, ${wallet}, ${receipt.provider_id}, ${receipt.model_class},
                  ${claimId}, ${hash}, ${text}, ${digest}, ${filing.signature.toLowerCase()}, ${stake}, 'open')
              `
              if (!(yield* points.lockStake(wallet, stake))) return yield* uncovered
            })
          )
          .pipe(Effect.catchTag("SqlError", filingConflict))
        return yield* Effect.orDie(decodeView((yield* select(sql`challenge_id = ${id}`))[0]))
      })

      const verdict = Effect.fn("Challenges.verdict")(function* (
        challengeId: string,
        verdict: Verdict,
        note: string | undefined
      ) {
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const rows = yield* sql<{ status: string; wallet: string; stake: string; provider_id: string }>`
                SELECT status, wallet, stake::text, provider_id FROM integrity_challenges
                WHERE challenge_id = ${challengeId} FOR UPDATE
              `
              const row = rows[0]
              if (row === undefined) {
                return yield* new NotFound({
                  code: "challenge_not_found",
                  message: `No challenge ${challengeId}`
                })
              }
              if (row.status !== "open") {
                return yield* new Conflict({
                  code: "challenge_not_open",
                  message: `Challenge ${challengeId} already has the verdict ${row.status}`
                })
              }
              const stake = Number(row.stake)
              const slash = verdict === "upheld" ? slashOf(stake) : null
              const bounty = slash === null ? null : bountyOf(slash)
              yield* sql`
                UPDATE integrity_challenges SET status = ${verdict}, slash = ${slash}, bounty = ${bounty},
                  note = ${note ?? null}, decided_at = now()
                WHERE challenge_id = ${challengeId}
              `
              yield* points.settleStake(row.wallet, stake, verdict, bounty ?? 0)
              if (slash !== null) yield* points.slashProvider(row.provider_id, challengeId, slash)
            })
          )
          .pipe(Effect.catchTag("SqlError", Effect.die))
        return (yield* select(sql`challenge_id = ${challengeId}`))[0]!
      })

      const list = Effect.fn("Challenges.list")(function* (
        status: ChallengeView["status"] | undefined,
        limit: number
      ) {
        return yield* select(status === undefined ? sql`true` : sql`status = ${status}`, limit)
      })

      return Challenges.of({ quote, file, verdict, list })
    })
  )
}
