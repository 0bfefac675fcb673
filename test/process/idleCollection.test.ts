import { spawn } from "node:child_process"
import { createServer } from "node:http"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import {
  httpActivity,
  isBackground,
  isBusy,
  isProbe,
  LIGHT_STARTS,
  QUIET_MS,
  shouldCollect
} from "../../src/process/IdleCollection.ts"
import { loadStretch } from "../support/Stopwatch.ts"

/**
 * Issue 12 item 5 (D271): garbage a burst left in the old generation is not collected by a quiet Node
 * process; the idle collection takes it once nothing is in flight.
 */
const child = fileURLToPath(new URL("./support/idleChild.ts", import.meta.url))
const MB = 1024 * 1024

/**
 * The child's lowest heap in use and committed heap within `seconds` after it dropped its garbage, and
 * what it dropped at.
 */
const heapAfterDrop = (mode: "with" | "without", seconds: number, quietMs = 0) =>
  new Promise<{ dropped: number; lowest: number; lowestTotal: number }>((resolve, reject) => {
    const proc = spawn(process.execPath, ["--expose-gc", child, mode, String(quietMs)], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    let dropped = Number.NaN
    let lowest = Number.POSITIVE_INFINITY
    let lowestTotal = Number.POSITIVE_INFINITY
    let reports = 0
    createInterface({ input: proc.stdout }).on("line", (line) => {
      const message = JSON.parse(line) as { dropped?: number; used?: number; total?: number }
      if (message.dropped !== undefined) dropped = message.dropped
      if (message.used !== undefined) {
        lowest = Math.min(lowest, message.used)
        lowestTotal = Math.min(lowestTotal, message.total ?? Number.POSITIVE_INFINITY)
        if (++reports >= seconds) proc.kill("SIGTERM")
      }
    })
    proc.on("error", reject)
    proc.on("exit", () => resolve({ dropped, lowest, lowestTotal }))
  })

describe("the idle collection", () => {
  it("collects only when nothing is in flight, nothing started since the last look, and the heap grew", () => {
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB))
    assert.isFalse(shouldCollect({ inFlight: 1, started: 0 }, 300 * MB, 100 * MB))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 3 }, 300 * MB, 100 * MB))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 0 }, 110 * MB, 100 * MB))
    // A warm-up's garbage (D411): 20 MB over what the last collection left is collected.
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 120 * MB, 100 * MB))
    // A collection that freed a lot may have run while the burst was still letting go: collect again.
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 110 * MB, 100 * MB, 300 * MB))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 0 }, 110 * MB, 100 * MB, 10 * MB))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 1 }, 110 * MB, 100 * MB, 300 * MB))
  })

  it("waits until the process has been quiet for the quiet span, 30 s in the router (D552)", () => {
    assert.strictEqual(QUIET_MS, 30_000)
    // A lull between bursts: quiet at this look, but not for long enough. Collecting would drop the optimized
    // code of every request's closures, and the next burst would compile it all again.
    assert.isFalse(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB, 0, 2_000))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB, 0, QUIET_MS - 1))
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB, 0, QUIET_MS))
    // Once quiet that long, a collection that freed much is followed at the next look, as before.
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 110 * MB, 100 * MB, 300 * MB, QUIET_MS + 2_000))
    // Another span, as the tests' child takes it.
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB, 0, 2_000, 2_000))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB, 0, 1_999, 2_000))
  })

  it("ends the quiet span on a look that saw work in flight or more than a trickle started (D552)", () => {
    assert.isFalse(isBusy({ inFlight: 0, started: 0 }))
    assert.isFalse(isBusy({ inFlight: 0, started: LIGHT_STARTS }))
    assert.isTrue(isBusy({ inFlight: 0, started: LIGHT_STARTS + 1 }))
    assert.isTrue(isBusy({ inFlight: 1, started: 0 }))
  })

  it.effect("does not count health probes, metric scrapes and providers' quotes as work", () =>
    Effect.scoped(
      Effect.gen(function* () {
        assert.deepStrictEqual(
          ["/health", "/ready", "/metrics", "/metrics?x=1", "/v1/models", "/healthz", "/", undefined].map(
            isProbe
          ),
          [true, true, true, true, false, false, false, false]
        )
        // A provider's standing quote is not a probe, but it is not work either (D552).
        assert.deepStrictEqual(
          ["/provider/quotes", "/provider/quotes?x=1", "/health", "/v1/chat/completions", undefined].map(
            isBackground
          ),
          [true, true, true, false, false]
        )
        const activity = yield* httpActivity
        // A real server in this process, seen through the channel the router's server reports on.
        const port = yield* Effect.acquireRelease(
          Effect.callback<{ port: number; close: () => void }>((resume) => {
            const server = createServer((_request, response) => response.end("ok"))
            server.listen(0, "127.0.0.1", () => {
              const address = server.address()
              resume(
                Effect.succeed({
                  port: typeof address === "object" && address !== null ? address.port : 0,
                  close: () => server.close()
                })
              )
            })
          }),
          (server) => Effect.sync(server.close)
        ).pipe(Effect.map((server) => server.port))
        const get = (path: string) =>
          Effect.promise(() => fetch(`http://127.0.0.1:${port}${path}`).then((reply) => reply.text()))
        activity.look()
        // Probed as an orchestrator and a scraper do, more often than the collection looks: still quiet.
        for (const path of [
          "/health",
          "/ready",
          "/metrics",
          "/health",
          "/ready?verbose=1",
          "/provider/quotes"
        ])
          yield* get(path)
        assert.deepStrictEqual(activity.look(), { inFlight: 0, started: 0 })
        // Work is counted.
        yield* get("/v1/models")
        yield* get("/health")
        assert.deepStrictEqual(activity.look(), { inFlight: 0, started: 1 })
      })
    )
  )

  it("gives a quiet process's garbage back, which Node alone keeps", { timeout: 120_000 }, async () => {
    const seconds = Math.ceil(4 * loadStretch())
    const without = await heapAfterDrop("without", seconds)
    const withIt = await heapAfterDrop("with", seconds)
    // The same process whose quiet span is longer than the test: the garbage is still there (D552).
    const notYet = await heapAfterDrop("with", seconds, 600_000)
    // About 150 MB of garbage was dropped; Node alone keeps it, the idle collection takes it.
    assert.isAbove(without.dropped, 120 * MB)
    assert.isAbove(without.lowest, 120 * MB, "Node collected the garbage by itself: the test shows nothing")
    assert.isBelow(withIt.lowest, 60 * MB, "the idle collection left the garbage")
    assert.isAbove(
      notYet.lowest,
      120 * MB,
      "the idle collection ran before the process had been quiet long enough"
    )
    // It compacts (D307): the pages the garbage was on, one kept array in twenty among it, go back. A
    // plain full collection frees the same garbage and keeps the heap committed at 65-160 MB here.
    assert.isBelow(withIt.lowestTotal, 50 * MB, "the idle collection kept the garbage's pages")
  })
})
