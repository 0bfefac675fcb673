/**
 * What the soak's router instances share, started by the soak itself as child processes: one Postgres
 * (the embedded one, in the run's folder; or a fresh database on the server of `DATABASE_URL`) and one
 * Anvil with the project's contracts deployed (`src/chain/Deployment.ts`), handed to each instance as an
 * external deployment (`RPC_URL` and the addresses and keys, as `WORKERS=N` hands them to its workers).
 * Also the two stalls: the database's (SIGSTOP of every embedded Postgres process, or, on an external
 * server, exclusive locks on the paid path's tables) and the chain's (SIGSTOP of Anvil).
 */
import { randomBytes } from "node:crypto"
import { PgClient } from "@effect/sql-pg"
import { Effect, Exit, Layer, ManagedRuntime, Redacted, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { type Address, type PublicClient, toHex } from "viem"
import type { Deployment } from "../../src/chain/Connection.ts"
import { embedded } from "../../src/chain/Deployment.ts"
import { routerSignerAccount, treasuryAccount } from "../../src/chain/DevAccounts.ts"
import { startEmbeddedPostgres } from "../../src/devnet/EmbeddedPostgres.ts"
import { tree } from "../load/Proc.ts"
import { sleep } from "../support/Children.ts"

export interface Infra {
  readonly databaseUrl: string
  /** The environment that makes a router an instance of this deployment. */
  readonly chainEnv: Record<string, string>
  readonly publicClient: PublicClient
  readonly token: Address
  readonly treasury: Address
  readonly routerSigner: Address
  readonly demoWallets: Deployment["demoWallets"]
  /** The database, as the soak's own queries reach it. */
  readonly sql: <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) => Promise<A>
  /** Stops the database for `ms`: what a stalled server or a blocking lock does to every instance. */
  readonly stallDatabase: (ms: number) => Promise<string>
  /** Stops Anvil for `ms`. */
  readonly stallChain: (ms: number) => Promise<string>
  readonly close: () => Promise<void>
}

const pidsOf = (comm: (name: string) => boolean) =>
  tree(process.pid)
    .filter((stat) => comm(stat.comm))
    .map((stat) => stat.pid)

const signal = (pids: ReadonlyArray<number>, name: NodeJS.Signals) => {
  for (const pid of pids) {
    try {
      process.kill(pid, name)
    } catch {
      // gone meanwhile
    }
  }
}

/** SIGSTOP, wait, SIGCONT (also when the wait is cut short). */
const stopFor = async (pids: ReadonlyArray<number>, ms: number) => {
  signal(pids, "SIGSTOP")
  try {
    await sleep(ms)
  } finally {
    signal(pids, "SIGCONT")
  }
}

/** A fresh database on the server of `adminUrl`, dropped at close. */
const freshDatabase = Effect.fnUntraced(function* (adminUrl: string) {
  const name = `soak_${randomBytes(4).toString("hex")}`
  const admin = PgClient.layer({ url: Redacted.make(adminUrl) })
  const run = (statement: string) =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(statement)
    }).pipe(Effect.provide(admin), Effect.orDie)
  yield* Effect.acquireRelease(run(`CREATE DATABASE ${name}`), () =>
    process.env.SOAK_KEEP === undefined ? run(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) : Effect.void
  )
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  return url.toString()
})

const key = (account: ReturnType<typeof routerSignerAccount>) => toHex(account.getHdKey().privateKey!)

export const startInfra = async (
  dataDir: string,
  externalDatabaseUrl: string | undefined
): Promise<Infra> => {
  const scope = await Effect.runPromise(Scope.make())
  const inScope = <A, E>(effect: Effect.Effect<A, E, Scope.Scope>) =>
    Effect.runPromise(Scope.provide(scope)(effect))
  try {
    const databaseUrl = await inScope(
      externalDatabaseUrl === undefined
        ? startEmbeddedPostgres({ dataDir, database: "router" })
        : freshDatabase(externalDatabaseUrl)
    )
    const deployment = await inScope(embedded(undefined))
    const runtime = ManagedRuntime.make(Layer.orDie(PgClient.layer({ url: Redacted.make(databaseUrl) })))
    const sql = <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
      runtime.runPromise(Effect.orDie(effect))

    const stallDatabase = async (ms: number) => {
      if (externalDatabaseUrl === undefined) {
        const pids = pidsOf((comm) => comm.startsWith("postgres"))
        await stopFor(pids, ms)
        return `SIGSTOP of ${pids.length} postgres processes for ${ms} ms`
      }
      // An external server is not ours to stop: a transaction holding `requests` blocks every
      // reservation, capture and settlement for as long. One table in one statement: a lock taken table by
      // table could wait in a circle with a router's transaction (a deadlock, not a stall).
      return sql(
        Effect.gen(function* () {
          const client = yield* SqlClient.SqlClient
          yield* client.withTransaction(
            client`LOCK TABLE requests IN ACCESS EXCLUSIVE MODE`.pipe(Effect.andThen(Effect.sleep(ms)))
          )
          return `an ACCESS EXCLUSIVE lock on requests for ${ms} ms`
        }).pipe(
          Effect.catchCause((cause) => Effect.succeed(`the lock failed: ${String(cause).slice(0, 200)}`))
        )
      )
    }
    const stallChain = async (ms: number) => {
      const pids = pidsOf((comm) => comm.startsWith("anvil"))
      await stopFor(pids, ms)
      return `SIGSTOP of anvil for ${ms} ms`
    }

    return {
      databaseUrl,
      chainEnv: {
        RPC_URL: deployment.connection.rpcUrl,
        CHAIN_ID: String(deployment.connection.chainId),
        TOKEN_ADDRESS: deployment.token,
        ANCHOR_ADDRESS: deployment.anchor,
        TREASURY_ADDRESS: deployment.treasury,
        ROUTER_PRIVATE_KEY: key(routerSignerAccount()),
        TREASURY_PRIVATE_KEY: key(treasuryAccount())
      },
      publicClient: deployment.connection.publicClient as unknown as PublicClient,
      token: deployment.token,
      treasury: deployment.treasury,
      routerSigner: deployment.router.address,
      demoWallets: deployment.demoWallets,
      sql,
      stallDatabase,
      stallChain,
      close: async () => {
        await runtime.dispose()
        await Effect.runPromise(Scope.close(scope, Exit.void))
      }
    }
  } catch (error) {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    throw error
  }
}
