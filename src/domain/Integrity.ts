import { Schema } from "effect"
import { WalletAddress as Address, Hex32, SignatureHex } from "./Wire.ts"

/** The model-integrity wire (spec 3.2, 4.5): claims, challengers, challenges and their verdicts. */

const ClaimId = Schema.String.check(Schema.isPattern(/^[A-Za-z0-9._:-]{1,128}$/))

/** A provider's signed claim (docs/protocol.md section 7): the model it serves for one class it quotes. */
export const SignedClaim = Schema.Struct({
  provider_id: ClaimId,
  model_class: ClaimId,
  /** The served model as the provider names it; one line, no control characters. */
  model: Schema.String.check(
    Schema.isPattern(/^\P{Cc}{1,200}$/u, { message: "expected 1 to 200 characters, no control characters" })
  ),
  /** Spec 2.11: metadata, not escrow. Base units. */
  bond_amount: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0), Schema.isLessThanOrEqualTo(10 ** 15)),
  /** Unix seconds; accepted within the window of `CLAIM_WINDOW_S` (`integrity/Claims.ts`). */
  signed_at: Schema.Int.check(Schema.isGreaterThan(0)),
  sig: Schema.String.check(Schema.isPattern(/^0x[0-9a-fA-F]{130}$/))
})
export type SignedClaim = typeof SignedClaim.Type

export const ClaimView = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model_integrity_claim"),
  provider_id: Schema.String,
  model_class: Schema.String,
  model: Schema.String,
  /** Base units. */
  bond_amount: Schema.Int,
  /** Always `metadata`: nothing is escrowed (spec 2.11). */
  bond_kind: Schema.Literal("metadata"),
  status: Schema.Literals(["active", "superseded"]),
  signed_at: Schema.Int,
  signer: Schema.String,
  signature: Schema.String,
  created_at: Schema.Int,
  superseded_at: Schema.NullOr(Schema.Int)
})
export type ClaimView = typeof ClaimView.Type

export const ChallengerStatus = Schema.Literals(["approved", "revoked", "not_approved"])

/** `GET /v1/model-integrity/challengers/:wallet` (public) and the admin answer. */
export const ChallengerView = Schema.Struct({
  object: Schema.Literal("model_integrity_challenger"),
  wallet: Schema.String,
  status: ChallengerStatus,
  approved: Schema.Boolean,
  /** Unix seconds of the last approval or revocation; null when the operator never decided. */
  updated_at: Schema.NullOr(Schema.Int)
})
export type ChallengerView = typeof ChallengerView.Type

/** The canonical evidence text a filing may carry, at most (docs/decisions.md D70). */
export const MAX_EVIDENCE_BYTES = 16 * 1024

/**
 * `POST /v1/model-integrity/challenges`: the evidence, its hash and the wallet's EIP-712 `ModelChallenge`
 * signature over `{purpose, wallet, receiptId: receipt_id, evidenceHash: evidence_hash}`.
 */
export const ChallengeFiling = Schema.Struct({
  wallet: Address,
  receipt_id: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128)),
  purpose: Schema.String,
  summary: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(2_000)),
  details: Schema.Json,
  evidence_hash: Hex32,
  signature: SignatureHex
})
export type ChallengeFiling = typeof ChallengeFiling.Type

export const ChallengeState = Schema.Literals(["open", "upheld", "rejected", "ambiguous"])
export const VerdictSchema = Schema.Literals(["upheld", "rejected", "ambiguous"])

/** A challenge as the challenger and the public see it: no evidence text. Points; times unix seconds. */
export const ChallengeView = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model_integrity_challenge"),
  status: ChallengeState,
  receipt_id: Schema.String,
  wallet: Schema.String,
  provider_id: Schema.String,
  model_class: Schema.String,
  claim_id: Schema.NullOr(Schema.String),
  evidence_hash: Schema.String,
  stake: Schema.Int,
  /** Upheld only: the points taken off the provider's score, and the challenger's half. */
  slash: Schema.NullOr(Schema.Int),
  bounty: Schema.NullOr(Schema.Int),
  created_at: Schema.Int,
  decided_at: Schema.NullOr(Schema.Int)
})
export type ChallengeView = typeof ChallengeView.Type

/** The operator's view: the evidence the challenger submitted and the verdict note. */
export const AdminChallengeView = Schema.Struct({
  ...ChallengeView.fields,
  evidence: Schema.Json,
  note: Schema.NullOr(Schema.String)
})
export type AdminChallengeView = typeof AdminChallengeView.Type

export const VerdictRequest = Schema.Struct({
  verdict: VerdictSchema,
  note: Schema.optionalKey(Schema.String.check(Schema.isMaxLength(2_000)))
})

/** `GET /v1/model-integrity/challenges/quote`: the stake and what to sign. */
export const ChallengeQuote = Schema.Struct({
  object: Schema.Literal("model_integrity_challenge_quote"),
  receipt_id: Schema.String,
  provider_id: Schema.String,
  model_class: Schema.String,
  claim_id: Schema.NullOr(Schema.String),
  charged: Schema.Int,
  unit: Schema.Literal("points"),
  base_earn: Schema.Int,
  minimum_stake: Schema.Int,
  /** max(minimum_stake, base_earn) */
  stake: Schema.Int,
  /** False while an open or upheld challenge holds the receipt. */
  open_to_challenge: Schema.Boolean,
  live_challenge: Schema.NullOr(Schema.String),
  wallet: Schema.NullOr(
    Schema.Struct({
      wallet: Schema.String,
      approved: Schema.Boolean,
      available: Schema.Int,
      covered: Schema.Boolean
    })
  ),
  signing: Schema.Struct({
    domain: Schema.Struct({ name: Schema.String, version: Schema.String }),
    primary_type: Schema.Literal("ModelChallenge"),
    purpose: Schema.String
  })
})
export type ChallengeQuote = typeof ChallengeQuote.Type

export const QuoteQuery = Schema.Struct({
  receipt_id: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(128)),
  wallet: Schema.optionalKey(Address)
})
