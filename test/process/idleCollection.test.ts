import { spawn } from "node:child_process"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { shouldCollect } from "../../src/process/IdleCollection.ts"
import { loadStretch } from "../support/Stopwatch.ts"

/**
 * Issue 12 item 5 (D271): garbage a burst left in the old generation is not collected by a quiet Node
 * process; the idle collection takes it once nothing is in flight.
 */
const child = fileURLToPath(new URL("./support/idleChild.ts", import.meta.url))
const MB = 1024 * 1024

/** The child's lowest heap in use within `seconds` after it dropped its garbage, and what it dropped at. */
const heapAfterDrop = (mode: "with" | "without", seconds: number) =>
  new Promise<{ dropped: number; lowest: number }>((resolve, reject) => {
    const proc = spawn(process.execPath, ["--expose-gc", child, mode], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    let dropped = Number.NaN
    let lowest = Number.POSITIVE_INFINITY
    let reports = 0
    createInterface({ input: proc.stdout }).on("line", (line) => {
      const message = JSON.parse(line) as { dropped?: number; used?: number }
      if (message.dropped !== undefined) dropped = message.dropped
      if (message.used !== undefined) {
        lowest = Math.min(lowest, message.used)
        if (++reports >= seconds) proc.kill("SIGTERM")
      }
    })
    proc.on("error", reject)
    proc.on("exit", () => resolve({ dropped, lowest }))
  })

describe("the idle collection", () => {
  it("collects only when nothing is in flight, nothing started since the last look, and the heap grew", () => {
    assert.isTrue(shouldCollect({ inFlight: 0, started: 0 }, 300 * MB, 100 * MB))
    assert.isFalse(shouldCollect({ inFlight: 1, started: 0 }, 300 * MB, 100 * MB))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 3 }, 300 * MB, 100 * MB))
    assert.isFalse(shouldCollect({ inFlight: 0, started: 0 }, 120 * MB, 100 * MB))
  })

  it("gives a quiet process's garbage back, which Node alone keeps", { timeout: 120_000 }, async () => {
    const seconds = Math.ceil(4 * loadStretch())
    const without = await heapAfterDrop("without", seconds)
    const withIt = await heapAfterDrop("with", seconds)
    // About 150 MB of garbage was dropped; Node alone keeps it, the idle collection takes it.
    assert.isAbove(without.dropped, 120 * MB)
    assert.isAbove(without.lowest, 120 * MB, "Node collected the garbage by itself: the test shows nothing")
    assert.isBelow(withIt.lowest, 60 * MB, "the idle collection left the garbage")
  })
})
