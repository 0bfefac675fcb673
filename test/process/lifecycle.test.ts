import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Effect, Exit, Layer, Redacted, Scope } from "effect"
import { launchAnvil } from "../../src/chain/Anvil.ts"
import { prepareState } from "../../src/chain/EmbeddedState.ts"
import { socketDirectory, startEmbeddedPostgres } from "../../src/devnet/EmbeddedPostgres.ts"
import { isAlive } from "../../src/process/ChildProcess.ts"
import { DataDirLockLive } from "../../src/process/DataDirLock.ts"
import { RouterConfig } from "../../src/RouterConfig.ts"
import { scratchDir } from "../support/Scratch.ts"

const rpc = (url: string, method: string, params: ReadonlyArray<unknown> = []) =>
  Effect.promise(() =>
    fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params })
    })
      .then((r) => r.json() as Promise<{ result: unknown }>)
      .then((r) => r.result)
  )

/** Opens a scope that stays open until closed by hand: what the launcher started there is a "leftover". */
const leftOpen = <A, E>(effect: Effect.Effect<A, E, Scope.Scope>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const value = yield* effect.pipe(Scope.provide(scope))
    return { value, close: Scope.close(scope, Exit.void) }
  })

describe("what an earlier run left running is found by pid and stopped", () => {
  it.live(
    "an Anvil left running writes its state when stopped, and the next one continues from it",
    () =>
      Effect.gen(function* () {
        const dir = yield* scratchDir("svc-anvil-")
        const state = { file: join(dir, "state.json"), intervalSeconds: 60, pidFile: join(dir, "anvil.pid") }
        const left = yield* leftOpen(launchAnvil({ state }))
        yield* rpc(left.value.rpcUrl, "anvil_mine", ["0x7"])
        assert.strictEqual(yield* rpc(left.value.rpcUrl, "eth_blockNumber"), "0x7")

        const next = yield* launchAnvil({ state })
        assert.isFalse(isAlive(left.value.pid))
        assert.strictEqual(yield* rpc(next.rpcUrl, "eth_blockNumber"), "0x7")
        assert.strictEqual(Number(readFileSync(state.pidFile, "utf8")), next.pid)
        yield* left.close
      }),
    60_000
  )

  it.live(
    "a Postgres left running on the data folder is stopped, and the next one starts there",
    () =>
      Effect.gen(function* () {
        const dataDir = yield* scratchDir("svc-pg-")
        const left = yield* leftOpen(startEmbeddedPostgres({ dataDir, database: "one", durable: false }))
        const leftPid = Number(
          readFileSync(join(dataDir, "postgres", "postmaster.pid"), "utf8").split("\n")[0]
        )
        assert.isTrue(isAlive(leftPid))

        const url = yield* startEmbeddedPostgres({ dataDir, database: "one", durable: false })
        assert.isFalse(isAlive(leftPid))
        assert.notStrictEqual(new URL(url).port, new URL(left.value).port)
        yield* left.close
        // The URL reaches the server over its Unix-domain socket (no server address), in its data folder.
        assert.strictEqual(new URL(url).searchParams.get("host"), join(dataDir, "postgres"))
        assert.deepStrictEqual(yield* serverAddress(url), [{ address: null }])
        // TCP stays open for tools (psql, the bench), on the port the URL names.
        const tcp = new URL(url)
        tcp.searchParams.delete("host")
        assert.deepStrictEqual(yield* serverAddress(tcp.toString()), [{ address: "127.0.0.1/32" }])
      }),
    120_000
  )
})

const serverAddress = (url: string) =>
  Effect.gen(function* () {
    const sql = yield* PgClient.PgClient
    return yield* sql<{ address: string | null }>`SELECT inet_server_addr()::text AS address`
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })), Effect.scoped, Effect.orDie)

describe("the embedded Postgres's Unix-domain socket", () => {
  it("is in the data folder when its path fits the kernel's 107 bytes, else there is none (TCP)", () => {
    const fits = `/${"d".repeat(107 - "/.s.PGSQL.65535".length - 1)}`
    assert.strictEqual(socketDirectory(fits, 65535), fits)
    assert.isUndefined(socketDirectory(`${fits}x`, 65535))
    // The port is part of the path: a shorter one leaves room.
    assert.strictEqual(socketDirectory(`${fits}x`, 5432), `${fits}x`)
  })
})

describe("the embedded chain's state files", () => {
  const whole = JSON.stringify({ block: {}, accounts: {}, best_block_number: "0x5" })

  it.effect("a whole dump is backed up at start", () =>
    Effect.gen(function* () {
      const dir = yield* scratchDir("svc-state-")
      writeFileSync(join(dir, "anvil-state.json"), whole)
      const state = yield* prepareState(dir)
      assert.strictEqual(state.file, join(dir, "anvil-state.json"))
      assert.strictEqual(readFileSync(join(dir, "anvil-state.backup.json"), "utf8"), whole)
    })
  )

  it.effect("a dump cut short is set aside and replaced by the backup", () =>
    Effect.gen(function* () {
      const dir = yield* scratchDir("svc-state-")
      writeFileSync(join(dir, "anvil-state.backup.json"), whole)
      writeFileSync(join(dir, "anvil-state.json"), whole.slice(0, 20))
      yield* prepareState(dir)
      assert.strictEqual(readFileSync(join(dir, "anvil-state.json"), "utf8"), whole)
      assert.isTrue(readdirSync(dir).some((name) => name.startsWith("anvil-state.json.damaged-")))
    })
  )

  it.effect("a dump cut short without a backup is set aside: the chain starts fresh", () =>
    Effect.gen(function* () {
      const dir = yield* scratchDir("svc-state-")
      writeFileSync(join(dir, "anvil-state.json"), "{")
      yield* prepareState(dir)
      assert.isFalse(existsSync(join(dir, "anvil-state.json")))
    })
  )
})

describe("one router per DATA_DIR", () => {
  const lock = (dataDir: string) =>
    Layer.build(
      DataDirLockLive.pipe(
        Layer.provide(RouterConfig.layerTest({ dataDir })),
        // Nothing external configured: the database and the chain would be embedded in DATA_DIR.
        Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({})))
      )
    )

  it.effect("a DATA_DIR held by a living router is refused; one whose router is gone is taken over", () =>
    Effect.gen(function* () {
      const dataDir = yield* scratchDir("svc-lock-")
      const file = join(dataDir, "router.pid")

      // This test's own process stands for a router that is running.
      writeFileSync(file, `${process.ppid}\n`)
      const refused = yield* Effect.exit(Effect.scoped(lock(dataDir)))
      assert.isTrue(Exit.isFailure(refused))
      assert.strictEqual(readFileSync(file, "utf8"), `${process.ppid}\n`)

      writeFileSync(file, "2147483000\n")
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* lock(dataDir)
          assert.strictEqual(readFileSync(file, "utf8"), `${process.pid}\n`)
        })
      )
      assert.isFalse(existsSync(file))
    })
  )
})
