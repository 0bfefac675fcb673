/**
 * `npm run bench:json-rpc`: what one JSON-RPC POST to the chain's node costs the router's process, the
 * transport `chain/JsonRpc.ts` uses (`httpPost`: straight on an undici pool, one handler a request, D578)
 * against Node's own HTTP client with kept-alive connections (the transport before it, kept here as the
 * baseline): CPU µs and wall µs a request, one request at a time, alternating rounds in one process, each
 * figure the median of `BENCH_ROUNDS` rounds of `BENCH_OPS` requests. The node is a process of its own (a
 * node:http server answering a two-call batch as Anvil would), so its CPU is not counted. An x402 call
 * makes about 2.5 such requests (its two reads, its transfer's send, receipt and checks). Asserts nothing.
 */
import { spawn } from "node:child_process"
import * as http from "node:http"
import { httpPost, type PostJson } from "../src/chain/JsonRpc.ts"
import { median } from "./support/Stats.ts"

const OPS = Number(process.env.BENCH_OPS ?? 3_000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 7)

const NODE = `
const http = require("node:http")
const server = http.createServer((request, response) => {
  const chunks = []
  request.on("data", (chunk) => chunks.push(chunk))
  request.on("end", () => {
    const calls = JSON.parse(Buffer.concat(chunks).toString("utf8"))
    const body = JSON.stringify(calls.map((call) => ({ jsonrpc: "2.0", id: call.id, result: "0x" + "0".repeat(63) + "1" })))
    response.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
    response.end(body)
  })
})
server.keepAliveTimeout = 60000
server.listen(0, "127.0.0.1", () => process.stdout.write(String(server.address().port) + "\\n"))
`

/** Node's own client, kept-alive (a few sockets), as `httpPost` was before D578. */
const nodeHttpPost = (rpcUrl: string): PostJson => {
  const url = new URL(rpcUrl)
  const agent = new http.Agent({ keepAlive: true, maxSockets: 8 })
  return (body) =>
    new Promise((resolve, reject) => {
      const request = http.request(
        url,
        {
          method: "POST",
          agent,
          headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) }
        },
        (response) => {
          const chunks: Array<Buffer> = []
          response.on("data", (chunk: Buffer) => chunks.push(chunk))
          response.on("end", () =>
            resolve({ status: response.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") })
          )
          response.on("error", reject)
        }
      )
      request.on("error", reject)
      request.end(body)
    })
}

const node = spawn(process.execPath, ["-e", NODE], { stdio: ["ignore", "pipe", "inherit"] })
const port = await new Promise<string>((resolve, reject) => {
  node.stdout.once("data", (data) => resolve(String(data).trim()))
  node.once("exit", (code) => reject(new Error(`the node process exited (${code}) before it listened`)))
})
const url = `http://127.0.0.1:${port}/`
const body = JSON.stringify([
  { jsonrpc: "2.0", id: 0, method: "eth_call", params: [{ to: "0x0", data: "0x" }, "latest"] },
  { jsonrpc: "2.0", id: 1, method: "eth_getBalance", params: ["0x0", "latest"] }
])

const transports: Record<string, PostJson> = {
  "node:http (baseline)": nodeHttpPost(url),
  "undici dispatch (httpPost)": httpPost(url, 10_000)
}
const readings: Record<string, { cpu: Array<number>; wall: Array<number> }> = {}
for (const name of Object.keys(transports)) readings[name] = { cpu: [], wall: [] }

const round = async (name: string, post: PostJson, ops: number) => {
  const cpu = process.cpuUsage()
  const started = performance.now()
  for (let i = 0; i < ops; i++) {
    const answer = await post(body)
    if (answer.status !== 200 || !answer.body.startsWith("[")) throw new Error(`${name}: ${answer.status}`)
  }
  const used = process.cpuUsage(cpu)
  return { cpu: (used.user + used.system) / ops, wall: ((performance.now() - started) * 1000) / ops }
}

try {
  // Warm both (connections open, code compiled) before anything is counted.
  for (const [name, post] of Object.entries(transports)) await round(name, post, 500)
  for (let r = 0; r < ROUNDS; r++) {
    const order = Object.entries(transports)
    for (const [name, post] of r % 2 === 0 ? order : order.reverse()) {
      const { cpu, wall } = await round(name, post, OPS)
      readings[name]!.cpu.push(cpu)
      readings[name]!.wall.push(wall)
    }
  }
  console.log(`JSON-RPC POST of a two-call batch, one at a time (${ROUNDS} rounds of ${OPS}, medians):`)
  console.log(`${"transport".padEnd(28)}${"CPU µs/request".padStart(16)}${"wall µs/request".padStart(17)}`)
  for (const [name, { cpu, wall }] of Object.entries(readings)) {
    console.log(
      `${name.padEnd(28)}${median(cpu).toFixed(1).padStart(16)}${median(wall).toFixed(1).padStart(17)}`
    )
  }
} finally {
  node.kill()
}
process.exit(0)
