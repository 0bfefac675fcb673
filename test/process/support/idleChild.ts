/**
 * Run by `test/process/idleCollection.test.ts` as `node --expose-gc idleChild.ts [with|without] [quiet ms]`:
 * leaves about 150 MB of old-generation garbage in an otherwise quiet process, then prints its heap in use
 * and committed size once a second. One array in twenty is kept, spread over the pages the garbage was on:
 * with the idle collection layer running, a compacting collection should take the garbage and give those
 * pages back (a plain one frees the garbage but keeps every page a kept array is on).
 */
import v8 from "node:v8"
import { Effect, Layer } from "effect"
import { IdleCollection, QUIET_MS } from "../../../src/process/IdleCollection.ts"

const withLayer = process.argv[2] === "with"
// How long the process must be quiet before it collects (the router's 30 s unless told).
const quietMs = Number(process.argv[3] ?? QUIET_MS)
// Started first, as the router starts it: what the heap holds then is its baseline.
Effect.runFork(withLayer ? Layer.launch(IdleCollection.collectingAfter(quietMs)) : Effect.never)
let garbage: Array<Array<number>> | undefined = []
const kept: Array<Array<number>> = []
for (let i = 0; i < 150_000; i++) {
  const array = Array.from({ length: 120 }, (_, j) => i + j + 0.5)
  garbage.push(array)
  if (i % 20 === 0) kept.push(array)
}
garbage = undefined
process.stdout.write(`${JSON.stringify({ dropped: v8.getHeapStatistics().used_heap_size })}\n`)
// A router is never idle inside: quote refreshes, heartbeats and metrics allocate a little all the time,
// enough that V8's own memory reducer does not find the allocation rate low.
const churn: { last: Array<unknown> } = { last: [] }
const background = setInterval(() => {
  churn.last = Array.from({ length: 2_000 }, (_, i) => ({ i, at: Date.now() }))
}, 20)
const report = setInterval(() => {
  const heap = v8.getHeapStatistics()
  process.stdout.write(
    `${JSON.stringify({ used: heap.used_heap_size, total: heap.total_heap_size, kept: kept.length })}\n`
  )
}, 1000)
process.on("SIGTERM", () => {
  clearInterval(report)
  clearInterval(background)
  churn.last = []
  process.exit(0)
})
