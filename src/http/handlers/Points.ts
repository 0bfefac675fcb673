import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { Points } from "../../points/Points.ts"
import { Rewards } from "../../points/Rewards.ts"
import { Api } from "../Api.ts"

export const PointsHandlers = HttpApiBuilder.group(
  Api,
  "points",
  Effect.fn(function* (handlers) {
    const points = yield* Points
    const rewards = yield* Rewards
    return handlers
      .handle("leaderboard", ({ query }) =>
        Effect.map(points.leaderboard(query.limit ?? 25), (data) => ({
          object: "list" as const,
          unit: "points" as const,
          data
        }))
      )
      .handle("providerPoints", ({ params }) => points.provider(params.id))
      .handle("account", ({ params }) => points.account(params.wallet))
      .handle("follow", ({ payload }) => rewards.claim("follow", payload))
      .handle("demoShare", ({ payload }) => rewards.claim("demo_share", payload))
  })
)
