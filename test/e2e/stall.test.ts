import { readFileSync } from "node:fs"
import { assert, describe, layer } from "@effect/vitest"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { x402Client } from "@x402/fetch"
import { Clock, Effect, Layer, Redacted } from "effect"
import { HttpServer } from "effect/http"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { databaseFromUrl } from "../../src/db/Database.ts"
import { Fleet } from "../../src/devnet/fleet/Fleet.ts"
import { HttpServerLive } from "../../src/http/Server.ts"
import { ServicesLive } from "../../src/Router.ts"
import { RouterConfig } from "../../src/RouterConfig.ts"
import { PausableProxy } from "../support/PausableProxy.ts"
import { officialPayingFetch, waitFor, waitForBook } from "../support/Pay.ts"
import { childrenOf, freshDatabase } from "../support/Process.ts"
import { call, OPERATOR_TOKEN, RouterUrl } from "../support/Router.ts"

/**
 * Well under what a stall cost before (viem's 4 × 10 s per chain read; a database query's cancel
 * stalling with the database), and loose enough for a loaded machine: the bounds themselves are 2 s.
 */
const ANSWERED_WITHIN_MS = 8_000

const timed = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const started = yield* Clock.currentTimeMillis
    const value = yield* effect
    return { value, ms: (yield* Clock.currentTimeMillis) - started }
  })

/** The router in process with the fleet, over a fresh database reached through a proxy that can stall. */
const stallableRouter = Layer.unwrap(
  Effect.gen(function* () {
    const db = yield* Effect.acquireRelease(
      Effect.promise(() => freshDatabase()),
      (db) => Effect.promise(() => db.drop())
    )
    const target = new URL(db.url)
    const proxy = yield* PausableProxy.make({ host: target.hostname, port: Number(target.port || 5432) })
    const viaProxy = new URL(db.url)
    viaProxy.hostname = "127.0.0.1"
    viaProxy.port = String(proxy.port)
    // The embedded server's URL names its Unix-domain socket folder (`host`, D310), which clients take
    // over the URL's host: through the proxy it must be TCP.
    viaProxy.searchParams.delete("host")
    const config = RouterConfig.layerTest({ port: 0 })
    const infrastructure = Layer.mergeAll(databaseFromUrl(viaProxy.toString()), Chain.layer).pipe(
      Layer.provideMerge(config),
      Layer.provideMerge(Layer.succeed(PausableProxy, proxy))
    )
    const url = Layer.effect(
      RouterUrl,
      Effect.map(Effect.service(HttpServer.HttpServer), (server) => {
        const address = server.address
        return "port" in address ? `http://127.0.0.1:${address.port}` : "http://127.0.0.1"
      })
    )
    const router = url.pipe(
      Layer.provideMerge(HttpServerLive),
      Layer.provideMerge(ServicesLive),
      Layer.provideMerge(infrastructure)
    )
    const fleet = Layer.unwrap(
      Effect.map(RouterUrl, (base) =>
        Fleet.layer({ routerUrl: base, operatorToken: Redacted.make(OPERATOR_TOKEN), refreshMs: 2_000 })
      )
    )
    return fleet.pipe(Layer.provideMerge(router))
  })
)

const signalAll = (pids: ReadonlyArray<number>, signal: NodeJS.Signals) =>
  Effect.sync(() => {
    for (const pid of pids) process.kill(pid, signal)
  })

/** The Anvil processes this test file started (children of this process). */
const anvils = () =>
  childrenOf(process.pid).filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("anvil")
    } catch {
      return false
    }
  })

const paidChat = Effect.gen(function* () {
  const chain = yield* Chain
  const base = yield* RouterUrl
  const account = privateKeyToAccount(chain.demoWallets[0]!.privateKey!)
  const client = new x402Client()
    .register(chain.network, new ExactEvmScheme(account))
    .setSpendControls({ allowedAssets: true })
  return yield* Effect.promise(async () => {
    const response = await officialPayingFetch(client)(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "auto", max_tokens: 20, messages: [{ role: "user", content: "hi" }] })
    })
    return { status: response.status, body: (await response.json()) as Record<string, unknown> }
  })
})

describe("a stalled chain or database", () => {
  layer(stallableRouter, { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect(
      "with Anvil stopped, an x402 call is a quick 402 payment_verification_unavailable, retryable",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          assert.strictEqual((yield* paidChat).status, 200)
          const stopped = anvils()
          assert.isAbove(stopped.length, 0)
          yield* signalAll(stopped, "SIGSTOP")
          const { value: refused, ms } = yield* timed(paidChat).pipe(
            Effect.ensuring(signalAll(stopped, "SIGCONT"))
          )
          assert.strictEqual(refused.status, 402)
          assert.strictEqual(refused.body.code, "payment_verification_unavailable")
          assert.strictEqual(refused.body.retryable, true)
          assert.isBelow(ms, ANSWERED_WITHIN_MS)
          // The same payer is served again once the chain answers.
          assert.strictEqual((yield* paidChat).status, 200)
        })
    )

    it.effect("/ready answers 503 within its bound while the chain or the database hangs", () =>
      Effect.gen(function* () {
        const proxy = yield* PausableProxy
        assert.strictEqual((yield* call("/ready")).status, 200)

        const stopped = anvils()
        assert.isAbove(stopped.length, 0)
        yield* signalAll(stopped, "SIGSTOP")
        const chainStalled = yield* timed(call("/ready")).pipe(Effect.ensuring(signalAll(stopped, "SIGCONT")))
        assert.strictEqual(chainStalled.value.status, 503)
        assert.strictEqual((chainStalled.value.json as { chain: { status: string } }).chain.status, "down")
        assert.isBelow(chainStalled.ms, ANSWERED_WITHIN_MS)

        proxy.pause()
        const dbStalled = yield* Effect.all(
          [timed(call("/ready")), timed(call("/ready")), timed(call("/metrics"))],
          {
            concurrency: "unbounded"
          }
        ).pipe(Effect.ensuring(Effect.sync(() => proxy.resume())))
        for (const ready of dbStalled.slice(0, 2)) {
          assert.strictEqual(ready.value.status, 503)
          assert.strictEqual((ready.value.json as { database: { status: string } }).database.status, "down")
          assert.isBelow(ready.ms, ANSWERED_WITHIN_MS)
        }
        assert.strictEqual(dbStalled[2]!.value.status, 200)
        assert.isBelow(dbStalled[2]!.ms, ANSWERED_WITHIN_MS)

        // Both answer again: ready (once the pool's connections and the chain have caught up, which on a
        // loaded machine can take longer than any fixed pause).
        yield* waitFor(
          "/ready to answer 200 again",
          Effect.map(call("/ready"), (r) => (r.status === 200 ? true : undefined))
        )
      })
    )
  })
})
