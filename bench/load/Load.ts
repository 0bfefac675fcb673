/**
 * The two load shapes of `npm run bench:load`.
 *
 * - Closed loop: `autocannon` with N connections, each sending its next request when the last
 *   answered (throughput at saturation; latency then includes queueing).
 * - Open loop: requests sent on a fixed schedule whatever the answers do (R per second, evenly
 *   spaced), latency measured from the scheduled send time, so a slow answer cannot hide the
 *   requests that would have queued behind it (no coordinated omission).
 */
import { Agent, request } from "node:http"
import autocannon from "autocannon"

export interface Target {
  readonly name: string
  readonly url: string
  /** Headers per request; an x402 target hands out a fresh signed payment each call. */
  readonly headers: () => Record<string, string>
  readonly body: string
}

export interface LoadResult {
  readonly requests: number
  readonly seconds: number
  readonly rps: number
  readonly p50: number
  readonly p99: number
  /** Non-2xx answers, socket errors and timeouts. */
  readonly failures: number
  /** The first failure's status and body (truncated), to say why. */
  readonly firstFailure?: string
}

const quantile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!

export const closedLoop = async (
  target: Target,
  connections: number,
  seconds: number
): Promise<LoadResult> => {
  const started = performance.now()
  const result = await autocannon({
    url: target.url,
    method: "POST",
    connections,
    duration: seconds,
    timeout: 30,
    headers: { "content-type": "application/json", ...target.headers() },
    body: target.body
  })
  const elapsed = (performance.now() - started) / 1000
  const requests = result.requests.total
  const failures = result.non2xx + result.errors + result.timeouts
  return {
    requests,
    seconds: elapsed,
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    failures,
    ...(failures > 0 ? { firstFailure: `${result.non2xx} non-2xx, ${result.errors} errors` } : {})
  }
}

/**
 * One request, resolved with its status and body when the answer has ended (status 0: a socket error
 * or `idleTimeoutMs` without a byte); `onFirstData` is told when the first piece of the body arrives.
 */
export const send = (
  agent: Agent,
  target: Target,
  onFirstData: (status: number) => void = () => {},
  idleTimeoutMs = 30_000
) =>
  new Promise<{ status: number; text: string }>((resolve) => {
    const url = new URL(target.url)
    const outgoing = request(
      {
        agent,
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        method: "POST",
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(target.body),
          ...target.headers()
        }
      },
      (response) => {
        const parts: Array<Buffer> = []
        response.on("data", (part: Buffer) => {
          if (parts.length === 0) onFirstData(response.statusCode ?? 0)
          parts.push(part)
        })
        response.on("end", () =>
          resolve({ status: response.statusCode ?? 0, text: Buffer.concat(parts).toString("utf8") })
        )
        response.on("error", (error) => resolve({ status: 0, text: String(error) }))
      }
    )
    if (idleTimeoutMs > 0) outgoing.setTimeout(idleTimeoutMs, () => outgoing.destroy(new Error("timeout")))
    outgoing.on("error", (error) => resolve({ status: 0, text: String(error) }))
    outgoing.end(target.body)
  })

export const openLoop = async (target: Target, perSecond: number, seconds: number): Promise<LoadResult> => {
  const agent = new Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY })
  const count = Math.round(perSecond * seconds)
  const interval = 1000 / perSecond
  const latencies: Array<number> = []
  let failures = 0
  let firstFailure: string | undefined
  const started = performance.now()
  const pending: Array<Promise<void>> = []
  for (let i = 0; i < count; i++) {
    const scheduled = started + i * interval
    const wait = scheduled - performance.now()
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
    pending.push(
      send(agent, target).then(({ status, text }) => {
        latencies.push(performance.now() - scheduled)
        if (status < 200 || status >= 300) {
          failures++
          firstFailure ??= `${status} ${text.slice(0, 200)}`
        }
      })
    )
  }
  await Promise.all(pending)
  const elapsed = (performance.now() - started) / 1000
  agent.destroy()
  const sorted = latencies.sort((a, b) => a - b)
  return {
    requests: count,
    seconds: elapsed,
    rps: count / elapsed,
    p50: quantile(sorted, 0.5),
    p99: quantile(sorted, 0.99),
    failures,
    ...(firstFailure === undefined ? {} : { firstFailure })
  }
}
