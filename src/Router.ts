import { Layer } from "effect"
import { BannerLive } from "./Banner.ts"
import { Chain } from "./chain/Chain.ts"
import { DatabaseLive } from "./db/Database.ts"
import { Instances } from "./db/Instances.ts"
import { SimulatedFleetLive } from "./devnet/SimulatedFleet.ts"
import { Evals } from "./evals/Evals.ts"
import { HttpServerLive } from "./http/Server.ts"
import { AdmissionBound } from "./inference/AdmissionBound.ts"
import { LiveStreams } from "./inference/LiveStreams.ts"
import { Pipeline } from "./inference/Pipeline.ts"
import { RoutingPreview } from "./inference/Preview.ts"
import { Reaper } from "./inference/Reaper.ts"
import { Serve } from "./inference/Serve.ts"
import { Upstream } from "./inference/upstream/Upstream.ts"
import { Challengers } from "./integrity/Challengers.ts"
import { Challenges } from "./integrity/Challenges.ts"
import { Claims } from "./integrity/Claims.ts"
import { IntegrityConfig } from "./integrity/IntegrityConfig.ts"
import { Authorizations } from "./ledger/Authorizations.ts"
import { Epochs, PayoutConfig } from "./ledger/Epochs.ts"
import { Ledger } from "./ledger/Ledger.ts"
import { Readiness } from "./ledger/Readiness.ts"
import { Receipts } from "./ledger/Receipts.ts"
import { Reconciliation } from "./ledger/Reconciliation.ts"
import { Settle } from "./ledger/Settle.ts"
import { Treasury } from "./ledger/Treasury.ts"
import { Wallets } from "./ledger/Wallets.ts"
import { Withdrawals } from "./ledger/Withdrawals.ts"
import { Latency } from "./market/Latency.ts"
import { Listings } from "./market/Listings.ts"
import { ModelCatalog } from "./market/ModelCatalog.ts"
import { Providers } from "./market/Providers.ts"
import { QuoteBook } from "./market/QuoteBook.ts"
import { Rfq } from "./market/Rfq.ts"
import { Analytics } from "./marketdata/Analytics.ts"
import { Feedback } from "./marketdata/Feedback.ts"
import { MarketData, MarketDataConfig } from "./marketdata/MarketData.ts"
import { MarketPage } from "./marketdata/MarketPage.ts"
import { TaskFitBoard } from "./marketdata/TaskFitBoard.ts"
import { CreditKeys } from "./payment/CreditKeys.ts"
import { Credits } from "./payment/Credits.ts"
import { FundingService } from "./payment/Funding.ts"
import { Idempotency } from "./payment/Idempotency.ts"
import { KeyAnalytics } from "./payment/KeyAnalytics.ts"
import { Keys } from "./payment/Keys.ts"
import { KeysAuth } from "./payment/KeysAuth.ts"
import { PaymentVerifier } from "./payment/PaymentVerifier.ts"
import { Sessions } from "./payment/Sessions.ts"
import { Settlement } from "./payment/Settlement.ts"
import { TaskBudgets } from "./payment/TaskBudgets.ts"
import { X402Config } from "./payment/X402.ts"
import { Points } from "./points/Points.ts"
import { Rewards } from "./points/Rewards.ts"
import { DataDirLockLive } from "./process/DataDirLock.ts"
import { Drain } from "./process/Drain.ts"
import { GcMetricsLive } from "./process/GcMetrics.ts"
import { IdleCollection } from "./process/IdleCollection.ts"
import { RouterConfig } from "./RouterConfig.ts"
import { AgentSetups } from "./setup/AgentSetups.ts"
import { ApprovalPage } from "./setup/ApprovalPage.ts"
import { SetupSettings } from "./setup/SetupSettings.ts"
import { TaskEvents } from "./tasks/TaskEvents.ts"
import { Tasks } from "./tasks/Tasks.ts"
import { TaskTraces } from "./tasks/Trace.ts"
import { Verification } from "./tasks/Verification.ts"
import { Workspaces } from "./tasks/Workspaces.ts"

/**
 * The market: registry, book, latency, the task-fit evidence (kept by market data, read by the market
 * through its own interface) and the RFQ over them (the auction itself is pure).
 */
export const MarketLive = Layer.mergeAll(Rfq.layer, Listings.layer).pipe(
  Layer.provideMerge(Layer.mergeAll(QuoteBook.layer, TaskFitBoard.layer)),
  Layer.provideMerge(Providers.layer),
  Layer.provideMerge(Layer.mergeAll(ModelCatalog.layer, Latency.layer, Instances.layer))
)

/** Payments: x402 verification, the ledger, settlement, epoch refunds, idempotency, keys and credits. */
export const PaymentsLive = Receipts.layer.pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      Settlement.layer,
      Epochs.layer,
      Reconciliation.layer,
      Idempotency.layer,
      KeysAuth.layer,
      Credits.layer,
      Withdrawals.layer,
      KeyAnalytics.layer
    )
  ),
  Layer.provideMerge(Layer.mergeAll(PaymentVerifier.layer, Keys.layer, Wallets.layer, Authorizations.layer)),
  Layer.provideMerge(Layer.mergeAll(Ledger.layer, Treasury.layer)),
  Layer.provideMerge(Layer.mergeAll(X402Config.layer, PayoutConfig.layer))
)

/** Serving: the lifecycle over the market and payments, upstream clients and live streams. */
export const InferenceLive = Layer.mergeAll(Pipeline.layer, Reaper.layer, RoutingPreview.layer).pipe(
  Layer.provideMerge(Serve.layer),
  Layer.provideMerge(Layer.mergeAll(FundingService.layer, Settle.layer)),
  Layer.provideMerge(
    Layer.mergeAll(
      LiveStreams.layer,
      AdmissionBound.layer,
      Upstream.layerUndici,
      CreditKeys.layer,
      Sessions.layer,
      TaskBudgets.layer
    )
  ),
  Layer.provideMerge(PaymentsLive),
  Layer.provideMerge(MarketLive)
)

/** The programs of spec 4.5: points (derived from receipts) and the model-integrity challenge machine. */
export const ProgramsLive = Layer.mergeAll(Challenges.layer, Rewards.layer).pipe(
  Layer.provideMerge(Layer.mergeAll(Points.layer, Claims.layer, Challengers.layer, IntegrityConfig.layer))
)

/** The device-flow setup of coding-agent keys (spec 4.5), over the key registry. */
export const SetupLive = Layer.mergeAll(AgentSetups.layer, ApprovalPage.layer).pipe(
  Layer.provideMerge(SetupSettings.layer)
)

/** Durable tasks and evaluations (spec 4.3): records, event wake-ups, workspaces, verdicts, traces, evals. */
export const TasksLive = Layer.mergeAll(Verification.layer, TaskTraces.layer, Evals.layer).pipe(
  Layer.provideMerge(Workspaces.layer),
  Layer.provideMerge(Tasks.layer),
  Layer.provideMerge(TaskEvents.layer)
)

/** Public market data and analytics (spec 4.4), read from the clearing records the paid path leaves. */
export const MarketDataLive = Layer.mergeAll(Analytics.layer, Feedback.layer, MarketPage.layer).pipe(
  Layer.provideMerge(MarketData.layer),
  Layer.provideMerge(MarketDataConfig.layer)
)

/** Every service of the router over a database and a chain. */
export const ServicesLive = Layer.mergeAll(
  ProgramsLive,
  SetupLive,
  TasksLive,
  MarketDataLive,
  Readiness.layer
).pipe(Layer.provideMerge(InferenceLive), Layer.provideMerge(Drain.layer))

/**
 * The whole process: infrastructure (one router per DATA_DIR first), services, the HTTP server, then the
 * banner and the fleet. The services stay visible for the shutdown's drain (src/Shutdown.ts).
 */
export const RouterLive = Layer.mergeAll(
  HttpServerLive,
  IdleCollection.layer,
  GcMetricsLive,
  BannerLive.pipe(Layer.provide(HttpServerLive)),
  SimulatedFleetLive.pipe(Layer.provide(HttpServerLive))
).pipe(
  Layer.provideMerge(ServicesLive),
  Layer.provide(Layer.mergeAll(DatabaseLive, Chain.layerDurable).pipe(Layer.provide(DataDirLockLive))),
  Layer.provide(RouterConfig.layer)
)
