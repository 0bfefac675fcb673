/**
 * The zero-latency OpenAI-compatible upstream of `npm run bench:load`, run as a process of its own
 * (`node bench/load/mock.ts PORT`) so its CPU is never counted as a target's. It answers
 * `POST /v1/chat/completions` at once: a short SSE stream when `stream` is true (what the router
 * always asks for), one JSON completion otherwise. A message containing `[[hold]]` gets its first
 * chunk and then stays open until `POST /release` (the held-open-stream memory measurement).
 * `MOCK_CONTENT_CHUNKS=N` makes the streamed reply N content chunks long, written at once.
 * Plain Node, no dependencies: nothing here may be the bottleneck.
 */
import { createServer, type ServerResponse } from "node:http"

const port = Number(process.argv[2] ?? 0)
const held = new Set<ServerResponse>()

const chunk = (id: string, delta: Record<string, unknown>, finish: string | null) =>
  `data: ${JSON.stringify({
    id,
    object: "chat.completion.chunk",
    created: 1,
    model: "mock",
    choices: [{ index: 0, delta, finish_reason: finish }]
  })}\n\n`

const usage = { prompt_tokens: 12, completion_tokens: 6, total_tokens: 18 }

// `MOCK_CONTENT_CHUNKS` (default 1): how many content chunks follow the first, all in the one write (a long
// reply that arrives at once, D565).
const contentChunks = Math.max(1, Number(process.env.MOCK_CONTENT_CHUNKS ?? 1))

const tail = (id: string) =>
  (contentChunks === 1
    ? chunk(id, { content: " from the mock." }, null)
    : Array.from({ length: contentChunks }, (_, i) => chunk(id, { content: ` word${i}` }, null)).join("")) +
  chunk(id, {}, "stop") +
  `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: 1, model: "mock", choices: [], usage })}\n\n` +
  "data: [DONE]\n\n"

let counter = 0

const server = createServer((request, response) => {
  if (request.method === "POST" && request.url === "/release") {
    const count = held.size
    for (const open of held) open.end(tail("held"))
    held.clear()
    response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ released: count }))
    return
  }
  if (request.method === "GET" && request.url === "/held") {
    response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ held: held.size }))
    return
  }
  if (request.method !== "POST" || !request.url?.endsWith("/chat/completions")) {
    response.writeHead(404).end()
    return
  }
  const parts: Array<Buffer> = []
  request.on("data", (part: Buffer) => parts.push(part))
  request.on("end", () => {
    const text = Buffer.concat(parts).toString("utf8")
    let stream = false
    try {
      stream = (JSON.parse(text) as { stream?: boolean }).stream === true
    } catch {
      response.writeHead(400).end()
      return
    }
    const id = `chatcmpl-${++counter}`
    if (!stream) {
      response.writeHead(200, { "content-type": "application/json" }).end(
        JSON.stringify({
          id,
          object: "chat.completion",
          created: 1,
          model: "mock",
          choices: [
            {
              index: 0,
              message: { role: "assistant", content: "Hello from the mock." },
              finish_reason: "stop"
            }
          ],
          usage
        })
      )
      return
    }
    response.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" })
    const first = chunk(id, { role: "assistant", content: "Hello" }, null)
    if (text.includes("[[hold]]")) {
      response.write(first)
      held.add(response)
      response.on("close", () => held.delete(response))
      return
    }
    response.end(first + tail(id))
  })
})
server.keepAliveTimeout = 60_000
server.maxRequestsPerSocket = 0
server.listen(port, "127.0.0.1", () => {
  const address = server.address()
  process.stdout.write(
    `${JSON.stringify({ port: typeof address === "object" && address ? address.port : 0 })}\n`
  )
})
process.on("SIGTERM", () => process.exit(0))
