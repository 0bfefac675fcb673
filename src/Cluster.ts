import cluster, { type Worker } from "node:cluster"
import { Config, Console, Context, Deferred, Effect, Layer, Option, Redacted } from "effect"
import * as Runtime from "effect/Runtime"
import { toHex } from "viem"
import { Chain } from "./chain/Chain.ts"
import { routerSignerAccount, treasuryAccount } from "./chain/DevAccounts.ts"
import { databaseFromUrl, databaseUrl } from "./db/Database.ts"
import { SimulatedFleetLive } from "./devnet/SimulatedFleet.ts"
import { DataDirLockLive } from "./process/DataDirLock.ts"
import { RouterConfig } from "./RouterConfig.ts"
import { SHUTDOWN_MESSAGE } from "./Shutdown.ts"

/**
 * `WORKERS=N` (docs/decisions.md D177): N router processes on one port, one database and one chain.
 * The primary owns what there is one of: the `DATA_DIR` lock, the embedded Postgres (migrated once,
 * here) and the embedded Anvil, the simulated fleet and the signals. Each worker is a whole router
 * (`RouterLive`) configured as an instance of an external deployment: `DATABASE_URL`, `RPC_URL` and the
 * chain's addresses and keys come from the primary, so a worker starts no database or chain of its own.
 * The kernel's listening socket is shared through `node:cluster` (round robin on Linux). Instances of
 * one router already share everything that must be shared through Postgres (reservations, capacity
 * leases, quotes, sessions, idempotency claims); what a process keeps to itself is a live stream's
 * replay (`GET /v1/streams/:id` reaches the worker that serves it only by chance).
 */
export const workersFromEnv = (): number => {
  const raw = process.env.WORKERS
  if (raw === undefined || raw.trim() === "") return 1
  const n = Number(raw)
  if (!Number.isSafeInteger(n) || n < 1 || n > 256) {
    throw new Error(`WORKERS must be a whole number from 1 to 256 (got "${raw}")`)
  }
  return n
}

const external = (value: Option.Option<string>) => Option.isSome(value) && value.value.trim() !== ""

/** What the workers need to join the primary's database and chain, as the environment they read. */
const infrastructure = Effect.gen(function* () {
  const config = yield* RouterConfig
  yield* Layer.build(DataDirLockLive)
  const url = Redacted.value(yield* databaseUrl)
  // Migrated once, before any worker starts (the workers find it migrated), on one connection: the primary
  // serves no request, and a pool kept open (D538) would hold ten for its life.
  yield* Layer.build(databaseFromUrl(url, 1))
  const rpcConfigured = external(yield* Config.option(Config.String("RPC_URL")))
  const env: Record<string, string> = {
    DATABASE_URL: url,
    OPERATOR_TOKEN: Redacted.value(config.operatorToken),
    SIMULATED_FLEET: "false"
  }
  if (rpcConfigured) return { env, chain: undefined }
  const chain = Context.get(yield* Layer.build(Chain.layerDurable), Chain)
  const key = (account: ReturnType<typeof routerSignerAccount>) => toHex(account.getHdKey().privateKey!)
  Object.assign(env, {
    RPC_URL: chain.rpcUrl,
    CHAIN_ID: String(chain.chainId),
    TOKEN_ADDRESS: chain.token,
    ANCHOR_ADDRESS: chain.anchor,
    TREASURY_ADDRESS: chain.treasury,
    ROUTER_PRIVATE_KEY: key(routerSignerAccount()),
    TREASURY_PRIVATE_KEY: key(treasuryAccount())
  })
  return { env, chain }
})

const primary = (workers: number) =>
  Effect.scoped(
    Effect.gen(function* () {
      const config = yield* RouterConfig
      const stop = yield* Deferred.make<NodeJS.Signals>()
      let stopping = false
      const onSignal = (signal: NodeJS.Signals) => {
        if (!stopping) {
          stopping = true
          Deferred.doneUnsafe(stop, Effect.succeed(signal))
          return
        }
        // A second signal reaches the workers as one (each cuts its drain short).
        for (const worker of Object.values(cluster.workers ?? {})) worker?.process.kill("SIGTERM")
      }
      process.on("SIGTERM", onSignal)
      process.on("SIGINT", onSignal)

      const { env, chain } = yield* infrastructure
      const listening = yield* Deferred.make<void>()
      let ready = 0
      const fork = (): Worker => {
        const worker = cluster.fork(env)
        worker.once("listening", () => {
          ready++
          if (ready === workers) Deferred.doneUnsafe(listening, Effect.void)
        })
        worker.once("exit", (code, signal) => {
          if (stopping) return
          process.stderr.write(
            `router worker ${worker.process.pid} exited (${signal ?? code}); starting another\n`
          )
          fork()
        })
        return worker
      }
      for (let i = 0; i < workers; i++) fork()
      const started = yield* Deferred.await(listening).pipe(
        Effect.as(true),
        Effect.raceFirst(Effect.as(Deferred.await(stop), false))
      )

      if (started) {
        yield* Layer.build(SimulatedFleetLive)
        const lines = [`svc router: ${workers} worker processes serving ${config.publicUrl} (WORKERS)`]
        if (config.operatorTokenGenerated) {
          lines.push(`  operator token  ${Redacted.value(config.operatorToken)}  (generated for this run)`)
        }
        if (chain !== undefined && chain.demoWallets.length > 0) {
          lines.push("  demo wallets (public dev mnemonic, 10,000 test USDC each):")
          for (const wallet of chain.demoWallets) {
            lines.push(`    ${wallet.address}${wallet.privateKey ? `  key ${wallet.privateKey}` : ""}`)
          }
        }
        yield* Console.log(lines.join("\n"))
        const signal = yield* Deferred.await(stop)
        yield* Effect.logInfo(`${signal}: draining ${workers} workers`)
      }
      // Each worker drains as on its own signal (told once, whether or not the terminal's signal also
      // reached it); the database and the chain close after the last worker exits.
      const alive = Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined)
      yield* Effect.promise(() =>
        Promise.all(
          alive.map(
            (worker) =>
              new Promise<void>((resolve) => {
                if (worker.isDead()) return resolve()
                worker.once("exit", () => resolve())
                worker.send(SHUTDOWN_MESSAGE)
              })
          )
        )
      )
      yield* Effect.logInfo("workers stopped; closing the database and the chain")
    })
  )

/** Runs the primary of a `WORKERS=N` router until a signal, then drains the workers and exits. */
export const runCluster = (workers: number) =>
  Runtime.makeRunMain(({ fiber, teardown }) => {
    fiber.addObserver((exit) => teardown(exit, (code) => process.exit(code)))
  })(primary(workers).pipe(Effect.provide(RouterConfig.layer)))
