/**
 * `npm run bench:phases`: where a key-paid call's time goes below saturation (issue 12, "where the time goes"),
 * read from the router's own spans. Starts the zero-latency mock and the router as `bench:load` does, with
 * `OTEL_EXPORTER_OTLP_ENDPOINT` pointed at a receiver in this process (OTLP/HTTP JSON), drives the mock
 * directly and the router (credit key) in alternated open-loop rounds of `BENCH_RATE` requests a second (default
 * 100) for `BENCH_OPEN_SECONDS` (default 8), `BENCH_ROUNDS` (default 2) times, and prints, for the router's
 * calls, each span's median start and end from the call's server span and its median length: the reservation's
 * statement (`postgres` under `Completions.admit`), the upstream call (`POST` under `Serve.run`), the settlement
 * after the reply. Then, unless `BENCH_X402=0`, the same for x402 calls (official client payments signed before
 * each round, `x402Payments`), in rounds alternated with the key's, printed as a second table with the x402 call's
 * p50 over the key call's. Spans cost the router CPU of their own (D320 turns them off unless an endpoint is set),
 * so the router's latency here is above `bench:load`'s; the table is for the order and the shares, not the
 * totals. Asserts nothing.
 */
import { chmodSync, mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Children, freePort, sleep } from "../support/Children.ts"
import { runMain } from "../support/RunMain.ts"
import { mean } from "../support/Stats.ts"
import { openLoop, type Target } from "./Load.ts"
import { chatBody, startRouter, x402Payments } from "./Setup.ts"
import { type OtlpJson, type Phase, phasesOf, type Span, spansOf } from "./Spans.ts"

const RATE = Number(process.env.BENCH_RATE ?? 100)
const SECONDS = Number(process.env.BENCH_OPEN_SECONDS ?? 8)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2)
const X402 = process.env.BENCH_X402 !== "0"
const log = (line: string) => process.stderr.write(`[bench:phases] ${line}\n`)

/** The spans in at least a tenth of the calls, by their median start. */
const printPhases = (phases: ReadonlyArray<Phase>, calls: number) => {
  console.log(
    `${"span < parent".padEnd(44)} ${"in calls".padStart(8)} ${"start".padStart(7)} ${"end".padStart(7)} ${"length".padStart(7)}  (ms, medians)`
  )
  for (const phase of phases.filter((phase) => phase.calls >= calls / 10)) {
    console.log(
      `${phase.name.slice(0, 44).padEnd(44)} ${`${Math.round((100 * phase.calls) / calls)}%`.padStart(8)} ${phase.startMs.toFixed(3).padStart(7)} ${phase.endMs.toFixed(3).padStart(7)} ${phase.lengthMs.toFixed(3).padStart(7)}`
    )
  }
}

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-phases-"))
  // Embedded Postgres runs as another user when this runs as root: it must reach its directory.
  chmodSync(dataDir, 0o755)
  const children = new Children(log)
  children.stopOnSignals()
  if (process.env.BENCH_KEEP === undefined)
    children.atSignalExit(() => rmSync(dataDir, { recursive: true, force: true }))
  // Exports are kept as they came and read after the rounds: parsing them meanwhile would be work on the
  // event loop that times the calls.
  const exports: Array<Buffer> = []
  const receiver = createServer((request, response) => {
    const chunks: Array<Buffer> = []
    request.on("data", (chunk: Buffer) => chunks.push(chunk))
    request.on("end", () => {
      exports.push(Buffer.concat(chunks))
      response.writeHead(200, { "content-type": "application/json" }).end("{}")
    })
  })
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve))
  try {
    const mockPort = await freePort()
    children.start("mock", ["bench/load/mock.ts", String(mockPort)], {}, join(dataDir, "mock.log"))
    const mock = `http://127.0.0.1:${mockPort}`
    await children.waitFor("the mock", async () => (await fetch(`${mock}/held`)).ok, 30)
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`
    const started = await startRouter(children, {
      dataDir: join(dataDir, "router"),
      logFile: join(dataDir, "router.log"),
      mock,
      log
    })
    const { router, creditKey } = started
    const body = chatBody("Say hello to the load benchmark.", false)
    const direct: Target = { name: "direct", url: `${mock}/v1/chat/completions`, headers: () => ({}), body }
    const paid: Target = {
      name: "router",
      url: `${router}/v1/chat/completions`,
      headers: () => ({ "x-credit-key": creditKey }),
      body
    }
    // x402 calls pay with payments signed before each of their rounds (one a call), used in order.
    let payments: Array<Record<string, string>> = []
    let next = 0
    const x402: Target = {
      name: "x402",
      url: `${router}/v1/chat/completions`,
      headers: () => payments[next++] ?? {},
      body
    }
    const sign = async (seconds: number) => {
      payments = await x402Payments(router, body, RATE * seconds + 10)
      next = 0
    }
    await openLoop(paid, RATE, 3)
    await openLoop(direct, RATE, 1)
    if (X402) {
      await sign(3)
      await openLoop(x402, RATE, 3)
    }
    const sinceNs = BigInt(Date.now()) * 1_000_000n
    const p50 = { direct: [] as Array<number>, router: [] as Array<number>, x402: [] as Array<number> }
    for (let round = 0; round < ROUNDS; round++) {
      for (const target of X402 ? [direct, paid, x402] : [direct, paid]) {
        if (target === x402) await sign(SECONDS)
        const result = await openLoop(target, RATE, SECONDS)
        p50[target.name as "direct" | "router" | "x402"].push(result.p50)
        log(
          `round ${round + 1} ${target.name}: p50 ${result.p50.toFixed(2)} ms, p99 ${result.p99.toFixed(2)}, ${result.failures} failed`
        )
      }
    }
    // The exporter sends its batch every 5 s.
    await sleep(7_000)
    started.stop()
    const spans: Array<Span> = []
    for (const body of exports) {
      try {
        spans.push(...spansOf(JSON.parse(body.toString("utf8")) as OtlpJson))
      } catch {
        log(`an export that is not OTLP/HTTP JSON was skipped (${body.length} bytes)`)
      }
    }
    // The key's calls: every paid call's trace but the x402 ones (whose admission holds their own reservation).
    const { calls, phases } = phasesOf(spans, { sinceNs, without: "Ledger.reserveX402" })
    const reservation = phases.find((phase) => phase.name === "postgres < Completions.admit")
    if (calls === 0 || reservation === undefined) {
      throw new Error(
        `no paid call's spans came (${spans.length} spans in ${exports.length} exports): the router's span names changed?`
      )
    }
    console.log(
      `\nA key-paid call at ${RATE}/s, its spans (${calls} calls; traced, so slower than bench:load): ` +
        `p50 direct ${mean(p50.direct).toFixed(2)} ms, router ${mean(p50.router).toFixed(2)} ms\n`
    )
    const added = mean(p50.router) - mean(p50.direct)
    console.log(
      `added p50 over direct ${added.toFixed(2)} ms; the reservation's statement (median) ` +
        `${reservation.lengthMs.toFixed(2)} ms${added > 0 ? ` (${Math.round((100 * reservation.lengthMs) / added)}%)` : ""}\n`
    )
    printPhases(phases, calls)
    if (X402) {
      const paidX402 = phasesOf(spans, { sinceNs, within: "Ledger.reserveX402" })
      console.log(
        `\nAn x402 call at ${RATE}/s, its spans (${paidX402.calls} calls): p50 ${mean(p50.x402).toFixed(2)} ms, ` +
          `${(mean(p50.x402) - mean(p50.router)).toFixed(2)} ms over the key call's\n`
      )
      printPhases(paidX402.phases, paidX402.calls)
    }
  } finally {
    // The router's last export goes as it stops: the receiver is still there for it.
    await children.stopAll()
    receiver.close()
    if (process.env.BENCH_KEEP === undefined) rmSync(dataDir, { recursive: true, force: true })
  }
}

runMain(main)
