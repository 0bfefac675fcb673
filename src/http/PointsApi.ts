import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { Conflict, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import { Leaderboard, PointsAccount, ProviderPoints, RewardClaim, RewardGranted } from "../domain/Points.ts"
import { WalletAddress } from "../domain/Wire.ts"
import { openAi } from "./ErrorWire.ts"

const RewardErrors = [openAi(InvalidRequest), openAi(Unauthorized), openAi(Conflict)] as const

/** Points (spec 4.5; D61–D65): public reads, and the two one-time rewards signed by the wallet. */
export class PointsApi extends HttpApiGroup.make("points").add(
  HttpApiEndpoint.get("leaderboard", "/v1/points/leaderboard", {
    query: {
      limit: Schema.optional(
        Schema.NumberFromString.check(Schema.isInt(), Schema.isBetween({ minimum: 1, maximum: 100 }))
      )
    },
    success: Leaderboard
  }),
  HttpApiEndpoint.get("providerPoints", "/v1/points/provider/:id", {
    params: { id: Schema.String },
    success: ProviderPoints,
    error: openAi(NotFound)
  }),
  HttpApiEndpoint.get("account", "/v1/points/:wallet", {
    params: { wallet: WalletAddress },
    success: PointsAccount
  }),
  HttpApiEndpoint.post("follow", "/v1/points/follow", {
    payload: RewardClaim,
    success: RewardGranted,
    error: RewardErrors
  }),
  HttpApiEndpoint.post("demoShare", "/v1/points/demo-share", {
    payload: RewardClaim,
    success: RewardGranted,
    error: RewardErrors
  })
) {}
