/**
 * The 1,000 subscribers of `npm run bench:marketdata`, in a process of their own so that reading their
 * frames costs the router's process nothing. Each holds one `GET /v1/market/events`; on `watch <id>` the
 * process reports when the first and the last subscriber received a frame naming that request.
 */

import { request } from "node:http"

const [url, countText] = process.argv.slice(2)
const count = Number(countText)
const now = () => performance.timeOrigin + performance.now()

interface Subscriber {
  tail: Buffer
  seenAt: number
}
const subscribers: Array<Subscriber> = []
let watching: Buffer | undefined
let pending = 0
let first = Number.NaN
let last = Number.NaN
let bytes = 0

const report = () => {
  process.send?.({ type: "seen", first, last, seen: count - pending })
  watching = undefined
}

const open = (sub: Subscriber) =>
  new Promise<void>((resolve, reject) => {
    const req = request(`${url}/v1/market/events`, { agent: false }, (res) => {
      if (res.statusCode !== 200) return reject(new Error(`events answered ${res.statusCode}`))
      resolve()
      res.on("data", (chunk: Buffer) => {
        bytes += chunk.length
        const tail = sub.tail
        sub.tail = chunk.subarray(-80)
        if (watching === undefined || sub.seenAt > 0) return
        // A frame names the request near its start (the tape is newest first): search the bytes.
        if (
          chunk.indexOf(watching) >= 0 ||
          Buffer.concat([tail, chunk.subarray(0, 80)]).indexOf(watching) >= 0
        ) {
          const at = now()
          sub.seenAt = at
          if (Number.isNaN(first)) first = at
          last = at
          pending -= 1
          if (pending === 0) report()
        }
      })
      res.on("end", () => process.send?.({ type: "dropped" }))
    })
    req.on("error", reject)
    req.end()
  })

process.on("message", (message: { type: string; id?: string }) => {
  if (message.type === "watch") {
    for (const sub of subscribers) sub.seenAt = 0
    first = Number.NaN
    last = Number.NaN
    pending = count
    watching = Buffer.from(message.id ?? "")
    process.send?.({ type: "watching" })
    setTimeout(() => {
      if (watching?.equals(Buffer.from(message.id ?? ""))) report()
    }, 10_000)
  }
  if (message.type === "bytes") process.send?.({ type: "bytes", bytes })
})

const main = async () => {
  for (let i = 0; i < count; i += 50) {
    const batch = Array.from({ length: Math.min(50, count - i) }, () => ({
      tail: Buffer.alloc(0),
      seenAt: 0
    }))
    subscribers.push(...batch)
    await Promise.all(batch.map(open))
  }
  process.send?.({ type: "ready" })
}

main().catch((error) => {
  process.send?.({ type: "error", message: String(error) })
  process.exit(1)
})
