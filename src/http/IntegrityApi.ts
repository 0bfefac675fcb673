import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import {
  Conflict,
  FeatureGated,
  Forbidden,
  InvalidRequest,
  NotFound,
  Unauthorized
} from "../domain/Errors.ts"
import {
  AdminChallengeView,
  ChallengeFiling,
  ChallengeQuote,
  ChallengerView,
  ChallengeState,
  ChallengeView,
  ClaimView,
  QuoteQuery,
  SignedClaim,
  VerdictRequest
} from "../domain/Integrity.ts"
import { WalletAddress as Address } from "../domain/Wire.ts"
import { OperatorAuth } from "./AdminAuth.ts"
import { ChallengesGate } from "./ChallengesGate.ts"
import { openAi } from "./ErrorWire.ts"

/** Public reads of the shadow program (spec 4.5): claims and approved-challenger status. */
export class IntegrityApi extends HttpApiGroup.make("integrity").add(
  HttpApiEndpoint.get("claim", "/v1/model-integrity/claims/:id", {
    params: { id: Schema.String },
    success: ClaimView,
    error: openAi(NotFound)
  }),
  HttpApiEndpoint.get("challenger", "/v1/model-integrity/challengers/:wallet", {
    params: { wallet: Address },
    success: ChallengerView
  })
) {}

/** Off at launch (D55, D69): `403 feature_gated` before anything else unless `MODEL_INTEGRITY_CHALLENGES`. */
export class ChallengesApi extends HttpApiGroup.make("challenges")
  .add(
    HttpApiEndpoint.get("challengeQuote", "/v1/model-integrity/challenges/quote", {
      query: QuoteQuery,
      success: ChallengeQuote,
      error: [openAi(NotFound), openAi(FeatureGated)]
    }),
    HttpApiEndpoint.post("fileChallenge", "/v1/model-integrity/challenges", {
      payload: ChallengeFiling,
      success: ChallengeView.pipe(HttpApiSchema.status(201)),
      error: [
        openAi(InvalidRequest),
        openAi(Unauthorized),
        openAi(Forbidden),
        openAi(NotFound),
        openAi(Conflict),
        openAi(FeatureGated)
      ]
    })
  )
  .middleware(ChallengesGate) {}

/** The operator's side: approve or revoke challengers, read filings with their evidence, record verdicts. */
export class IntegrityAdminApi extends HttpApiGroup.make("integrityAdmin")
  .add(
    HttpApiEndpoint.post("setChallenger", "/v1/admin/model-integrity/challengers", {
      payload: Schema.Struct({ wallet: Address, approved: Schema.Boolean }),
      success: ChallengerView
    }),
    HttpApiEndpoint.get("listChallenges", "/v1/admin/model-integrity/challenges", {
      query: {
        status: Schema.optional(ChallengeState),
        limit: Schema.optional(
          Schema.NumberFromString.check(Schema.isInt(), Schema.isBetween({ minimum: 1, maximum: 200 }))
        )
      },
      success: Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(AdminChallengeView) })
    }),
    HttpApiEndpoint.post("recordVerdict", "/v1/admin/model-integrity/challenges/:id/verdict", {
      params: { id: Schema.String },
      payload: VerdictRequest,
      success: AdminChallengeView,
      error: [openAi(NotFound), openAi(Conflict)]
    })
  )
  .middleware(OperatorAuth) {}

/** A provider's signed model claim (D67), beside its signed quotes. */
export class ProviderClaimsApi extends HttpApiGroup.make("providerClaims").add(
  HttpApiEndpoint.post("submitClaim", "/provider/model-integrity/claims", {
    payload: SignedClaim,
    success: ClaimView,
    error: [openAi(InvalidRequest), openAi(Unauthorized), openAi(Forbidden), openAi(Conflict)]
  })
) {}
