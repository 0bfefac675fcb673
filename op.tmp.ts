import { ExactEvmScheme } from "@x402/evm/exact/client"
import { wrapFetchWithPayment, x402Client } from "@x402/fetch"
import OpenAI from "openai"
import { privateKeyToAccount } from "viem/accounts"
const base = process.env.BASE ?? "http://127.0.0.1:18402"
const mode = process.argv[2] ?? "basic"
const account = privateKeyToAccount(process.env.KEY as `0x${string}` ?? "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a")
const network = "eip155:31337"
const client = new x402Client().register(network, new ExactEvmScheme(account)).setSpendControls({ allowedAssets: [{ network, asset: "0x5FbDB2315678afecb367f032d93F642f64180aa3", maxAmountPerPayment: "10000000" }] })
const payingFetch = wrapFetchWithPayment(fetch, client)
const openai = new OpenAI({ apiKey: "x402", baseURL: `${base}/v1`, fetch: payingFetch, maxRetries: 0 })
if (mode === "basic") {
  const r = await openai.chat.completions.create({ model: "chat-medium", messages: [{ role: "user", content: "hello" }], max_tokens: 40 }).withResponse()
  console.log("non-streamed", r.response.status, r.response.headers.get("x-request-id"), (r.data as any).usage)
  const s = await openai.chat.completions.create({ model: "chat-small", messages: [{ role: "user", content: "stream" }], max_tokens: 40, stream: true })
  let n = 0
  for await (const c of s) n++
  console.log("streamed chunks", n)
}
if (mode === "hangup" || mode === "hold") {
  const count = Number(process.argv[3] ?? 3)
  await Promise.all(Array.from({ length: count }, async (_, i) => {
    const ctl = new AbortController()
    const s = await openai.chat.completions.create({ model: "chat-large", messages: [{ role: "user", content: "[[sim:long]] a long story" }], max_tokens: 2000, stream: true }, { signal: ctl.signal })
    let n = 0
    try {
      for await (const c of s) { n++; if (mode === "hangup" && n === 5) ctl.abort() }
    } catch (e) { console.log(`stream ${i}: ${mode === "hangup" ? "hung up" : "ended"} after ${n} chunks (${(e as Error).name})`); return }
    console.log(`stream ${i}: finished ${n} chunks`)
  }))
}
