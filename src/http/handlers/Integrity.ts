import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { Challengers } from "../../integrity/Challengers.ts"
import { Challenges } from "../../integrity/Challenges.ts"
import { Claims } from "../../integrity/Claims.ts"
import { Api } from "../Api.ts"

export const IntegrityHandlers = HttpApiBuilder.group(
  Api,
  "integrity",
  Effect.fn(function* (handlers) {
    const claims = yield* Claims
    const challengers = yield* Challengers
    return handlers
      .handle("claim", ({ params }) => claims.get(params.id))
      .handle("challenger", ({ params }) => challengers.status(params.wallet))
  })
)

export const ChallengesHandlers = HttpApiBuilder.group(
  Api,
  "challenges",
  Effect.fn(function* (handlers) {
    const challenges = yield* Challenges
    return handlers
      .handle("challengeQuote", ({ query }) => challenges.quote(query.receipt_id, query.wallet))
      .handle("fileChallenge", ({ payload }) => challenges.file(payload))
  })
)

export const IntegrityAdminHandlers = HttpApiBuilder.group(
  Api,
  "integrityAdmin",
  Effect.fn(function* (handlers) {
    const challengers = yield* Challengers
    const challenges = yield* Challenges
    return handlers
      .handle("setChallenger", ({ payload }) => challengers.set(payload.wallet, payload.approved))
      .handle("listChallenges", ({ query }) =>
        Effect.map(challenges.list(query.status, query.limit ?? 50), (data) => ({
          object: "list" as const,
          data
        }))
      )
      .handle("recordVerdict", ({ params, payload }) =>
        challenges.verdict(params.id, payload.verdict, payload.note)
      )
  })
)

export const ProviderClaimsHandlers = HttpApiBuilder.group(
  Api,
  "providerClaims",
  Effect.fn(function* (handlers) {
    const claims = yield* Claims
    return handlers.handle("submitClaim", ({ payload }) => claims.submit(payload))
  })
)
