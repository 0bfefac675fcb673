// zero-latency OpenAI-compatible mock: streams one content chunk, usage, [DONE]
import http from "node:http"
const port = Number(process.argv[2])
const body =
  'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hello world"},"finish_reason":null}]}\n\n' +
  'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}\n\n' +
  "data: [DONE]\n\n"
http.createServer((req, res) => {
  req.resume()
  req.on("end", () => {
    res.writeHead(200, { "content-type": "text/event-stream" })
    res.end(body)
  })
}).listen(port, "127.0.0.1", () => process.send?.("ready"))
