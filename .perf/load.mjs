// closed-loop (conns>0) or open-loop (rate) load: prints JSON {rps, p50, p99, errors}
import http from "node:http"
const [url, conns, seconds, rate, headersJson] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4]), Number(process.argv[5]), process.argv[6]]
const headers = { "content-type": "application/json", ...JSON.parse(headersJson || "{}") }
const u = new URL(url)
const agent = new http.Agent({ keepAlive: true, maxSockets: Math.max(conns, 1000) })
const payload = JSON.stringify({ model: "chat-small", messages: [{ role: "user", content: "hi" }], max_tokens: 16 })
const lat = []; let errors = 0; let firstErr
const one = () => new Promise((resolve) => {
  const t = performance.now()
  const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: "POST", headers, agent }, (res) => {
    let text = ""; res.setEncoding("utf8"); res.on("data", (d) => { text += d })
    res.on("end", () => { if (res.statusCode !== 200) { errors++; firstErr ??= `${res.statusCode} ${text.slice(0, 300)}` } else lat.push(performance.now() - t); resolve() })
  })
  req.on("error", (e) => { errors++; firstErr ??= String(e); resolve() })
  req.end(payload)
})
const end = performance.now() + seconds * 1000
const start = performance.now()
if (rate > 0) {
  const pending = []; const interval = 1000 / rate; let next = performance.now()
  while (performance.now() < end) {
    pending.push(one()); next += interval
    const wait = next - performance.now(); if (wait > 0) await new Promise((r) => setTimeout(r, wait))
  }
  await Promise.all(pending)
} else {
  await Promise.all(Array.from({ length: conns }, async () => { while (performance.now() < end) await one() }))
}
const elapsed = (performance.now() - start) / 1000
lat.sort((a, b) => a - b)
const q = (p) => lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : NaN
process.stdout.write(JSON.stringify({ n: lat.length, rps: lat.length / elapsed, p50: q(0.5), p99: q(0.99), errors, firstErr }) + "\n")
process.exit(0)
