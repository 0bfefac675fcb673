import { mkdirSync, rmSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { Config, Effect, Layer, Option, Schema } from "effect"
import { RouterConfig } from "../RouterConfig.ts"
import { commandLineOf, readPidFile } from "./ChildProcess.ts"

export class DataDirInUse extends Schema.TaggedError<DataDirInUse>()("DataDirInUse", {
  message: Schema.String
}) {}

const take = (file: string) => {
  try {
    writeFileSync(file, `${process.pid}\n`, { flag: "wx" })
    return true
  } catch {
    return false
  }
}

/**
 * One router per `DATA_DIR`, held for the process's life by `DATA_DIR/router.pid`. The embedded Postgres
 * and Anvil of a `DATA_DIR` belong to the router that holds it: a start that finds the file held by a
 * living router refuses to start (it would stop that router's database and chain as leftovers); a file
 * whose router is gone (a crash, SIGKILL) is taken over, and what that router left running is stopped
 * by its own launcher. Not taken when neither the database nor the chain is embedded.
 */
export const DataDirLockLive = Layer.effectDiscard(
  Effect.gen(function* () {
    const databaseUrl = yield* Config.option(Config.String("DATABASE_URL"))
    const rpcUrl = yield* Config.option(Config.String("RPC_URL"))
    const external = (value: Option.Option<string>) => Option.isSome(value) && value.value.trim() !== ""
    if (external(databaseUrl) && external(rpcUrl)) return
    const { dataDir } = yield* RouterConfig
    const file = join(resolve(dataDir), "router.pid")
    yield* Effect.acquireRelease(
      Effect.gen(function* () {
        yield* Effect.sync(() => mkdirSync(dataDir, { recursive: true }))
        if (take(file)) return
        const holder = readPidFile(file)
        const command = holder === undefined ? undefined : commandLineOf(holder)
        if (holder !== undefined && holder !== process.pid && command?.includes("node") === true) {
          return yield* new DataDirInUse({
            message: `another router (pid ${holder}) is running on DATA_DIR ${resolve(dataDir)}; stop it or use another DATA_DIR`
          })
        }
        yield* Effect.logWarning("taking over DATA_DIR from a router that is gone").pipe(
          Effect.annotateLogs({ previous: holder ?? "unknown" })
        )
        rmSync(file, { force: true })
        if (!take(file)) {
          return yield* new DataDirInUse({
            message: `DATA_DIR ${resolve(dataDir)} was taken by another router`
          })
        }
      }),
      () =>
        Effect.sync(() => {
          if (readPidFile(file) === process.pid) rmSync(file, { force: true })
        })
    )
  })
)
