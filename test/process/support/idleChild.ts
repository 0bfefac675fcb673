/**
 * Run by `test/process/idleCollection.test.ts` as `node --expose-gc idleChild.ts [with|without]`:
 * leaves about 150 MB of old-generation garbage in an otherwise quiet process, then prints its heap in use
 * once a second. With the idle collection layer running, a full collection should take the garbage.
 */
import v8 from "node:v8"
import { Effect, Layer } from "effect"
import { IdleCollection } from "../../../src/process/IdleCollection.ts"

const withLayer = process.argv[2] === "with"
// Started first, as the router starts it: what the heap holds then is its baseline.
Effect.runFork(withLayer ? Layer.launch(IdleCollection.layer) : Effect.never)
let garbage: Array<Array<number>> | undefined = []
for (let i = 0; i < 150_000; i++) garbage.push(Array.from({ length: 120 }, (_, j) => i + j + 0.5))
garbage = undefined
process.stdout.write(`${JSON.stringify({ dropped: v8.getHeapStatistics().used_heap_size })}\n`)
// A router is never idle inside: quote refreshes, heartbeats and metrics allocate a little all the time,
// enough that V8's own memory reducer does not find the allocation rate low.
const churn: { last: Array<unknown> } = { last: [] }
const background = setInterval(() => {
  churn.last = Array.from({ length: 2_000 }, (_, i) => ({ i, at: Date.now() }))
}, 20)
const report = setInterval(
  () => process.stdout.write(`${JSON.stringify({ used: v8.getHeapStatistics().used_heap_size })}\n`),
  1000
)
process.on("SIGTERM", () => {
  clearInterval(report)
  clearInterval(background)
  churn.last = []
  process.exit(0)
})
