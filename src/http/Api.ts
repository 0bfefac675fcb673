import { HttpApi, OpenApi } from "effect/http-api"
import { MessagesApi, ResponsesApi } from "./AdaptersApi.ts"
import { ChatApi, ReceiptsApi } from "./ChatApi.ts"
import { EvalsApi } from "./EvalsApi.ts"
import { GatedApi } from "./GatedApi.ts"
import { ImagesApi } from "./ImagesApi.ts"
import { ChallengesApi, IntegrityAdminApi, IntegrityApi, ProviderClaimsApi } from "./IntegrityApi.ts"
import { KeyAnalyticsApi } from "./KeyAnalyticsApi.ts"
import { CreditsApi, KeysApi, WalletsAdminApi } from "./KeysApi.ts"
import { AdminApi, MarketApi, ProviderApi, RoutingApi } from "./MarketApi.ts"
import { FeedbackApi, MarketAnalyticsApi, MarketDataApi, MarketPageApi } from "./MarketDataApi.ts"
import { PointsApi } from "./PointsApi.ts"
import { SessionsApi } from "./SessionsApi.ts"
import { AgentSetupApi, AgentSetupPageApi } from "./SetupApi.ts"
import { SystemApi } from "./SystemApi.ts"
import { TasksApi } from "./TasksApi.ts"

export class Api extends HttpApi.make("svc")
  .add(SystemApi)
  .add(GatedApi)
  .add(AdminApi)
  .add(ProviderApi)
  .add(MarketApi)
  .add(MarketDataApi)
  .add(MarketAnalyticsApi)
  .add(FeedbackApi)
  .add(MarketPageApi)
  .add(RoutingApi)
  .add(ChatApi)
  .add(ReceiptsApi)
  .add(SessionsApi)
  .add(KeyAnalyticsApi)
  .add(ResponsesApi)
  .add(MessagesApi)
  .add(ImagesApi)
  .add(WalletsAdminApi)
  .add(KeysApi)
  .add(CreditsApi)
  .add(IntegrityApi)
  .add(ChallengesApi)
  .add(IntegrityAdminApi)
  .add(ProviderClaimsApi)
  .add(PointsApi)
  .add(AgentSetupApi)
  .add(AgentSetupPageApi)
  .add(TasksApi)
  .add(EvalsApi)
  .annotateMerge(
    OpenApi.annotations({
      title: "svc market-cleared inference router",
      description:
        "OpenAI-compatible inference cleared by a second-score auction over signed standing quotes."
    })
  ) {}
