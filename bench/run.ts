/**
 * `npm run bench`: time to first token through the router against the provider's own,
 * measured in the same process on the same machine (the baseline), plus the router's
 * per-request overhead split into admission (auction, x402 verification, reservation; exact,
 * upto and a funded key side by side)
 * and streaming. Prints figures; asserts nothing (these machines are noisy).
 *
 * Uses DATABASE_URL when set, else an embedded Postgres in a temporary folder, and its
 * own Anvil. One simulated provider (OpenAI dialect) with a fixed 40 ms time to first token.
 * The script then runs `bench/marketdata.ts` (the market data reads and the events fan-out), a process
 * of its own so that neither run's router shares a heap with the other.
 */

import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { createPermit2ApprovalTx, UptoEvmScheme } from "@x402/evm/upto/client"
import { wrapFetchWithPayment, x402Client, x402HTTPClient } from "@x402/fetch"
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { createWalletClient, publicActions, http as viemHttp } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../src/chain/Chain.ts"
import { DatabaseLive } from "../src/db/Database.ts"
import { freePort } from "../src/devnet/EmbeddedPostgres.ts"
import { type ProviderConfig, simulationAccount } from "../src/devnet/fleet/FleetConfig.ts"
import * as ProviderServer from "../src/devnet/fleet/ProviderServer.ts"
import { freshQuote } from "../src/devnet/fleet/Quotes.ts"
import { HttpServerLive } from "../src/http/Server.ts"
import { hashSecret } from "../src/payment/Keys.ts"
import { ServicesLive } from "../src/Router.ts"
import { RouterConfig } from "../src/RouterConfig.ts"
import { tracingWith } from "../src/Telemetry.ts"
import { mean } from "./support/Stats.ts"

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 40)
const TOKEN = "bench-operator"

const quantile = (xs: ReadonlyArray<number>, q: number) => {
  const sorted = [...xs].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
}
const summary = (xs: ReadonlyArray<number>) =>
  `p50 ${quantile(xs, 0.5).toFixed(1)} ms  p95 ${quantile(xs, 0.95).toFixed(1)} ms  mean ${mean(xs).toFixed(1)} ms`

/** Milliseconds from sending the request to the first content delta of an SSE body. */
/** First-to-last content delta of the most recent stream (how long the tokens took to flow through). */
let lastStream = Number.NaN

const firstContentMs = async (
  doFetch: typeof fetch,
  url: string,
  body: unknown,
  headers: Record<string, string> = {}
) => {
  const started = performance.now()
  const response = await doFetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body)
  })
  if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`)
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ""
  let first = Number.NaN
  let last = Number.NaN
  let seen = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    text += decoder.decode(value, { stream: true })
    const contents = (text.match(/"content":"[^"]/g) ?? []).length
    if (contents > seen) {
      seen = contents
      last = performance.now() - started
      if (Number.isNaN(first)) first = last
    }
  }
  lastStream = last - first
  return first
}

const spanTable = (exporter: InMemorySpanExporter) => {
  const byName = new Map<string, Array<number>>()
  for (const span of exporter.getFinishedSpans()) {
    const ms = span.duration[0] * 1000 + span.duration[1] / 1e6
    byName.set(span.name, [...(byName.get(span.name) ?? []), ms])
  }
  return [...byName.entries()]
    .filter(([name]) =>
      /^(Completions|PaymentVerifier|Ledger|QuoteBook\.acquire|Market|Chain|Idempotency)/.test(name)
    )
    .map(([name, xs]) => `    ${name.padEnd(40)} ${mean(xs).toFixed(2).padStart(8)}  (n=${xs.length})`)
}

const main = async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "svc-bench-"))
  const port = await Effect.runPromise(freePort)
  const config = RouterConfig.layerTest({
    port,
    publicUrl: `http://127.0.0.1:${port}`,
    operatorToken: Redacted.make(TOKEN),
    dataDir
  })
  const infrastructure = Layer.mergeAll(DatabaseLive, Chain.layer).pipe(Layer.provideMerge(config))
  const spans = new InMemorySpanExporter()
  const runtime = ManagedRuntime.make(
    HttpServerLive.pipe(
      Layer.provideMerge(ServicesLive),
      Layer.provideMerge(infrastructure),
      Layer.provide(tracingWith([new SimpleSpanProcessor(spans)]))
    )
  )
  const providerConfig: ProviderConfig = {
    providerId: "bench-1",
    dialect: "openai",
    offers: [{ modelClass: "chat-small", priceIn: 100_000, priceOut: 400_000 }],
    ttftMs: 40,
    tokensPerSecond: 2_000,
    capacityRps: 64,
    maxContext: 32_000
  }
  const providerRuntime = ManagedRuntime.make(
    ProviderServer.ProviderServer.layer({
      providerId: providerConfig.providerId,
      dialect: providerConfig.dialect,
      modelClasses: ["chat-small"],
      ttftMs: providerConfig.ttftMs,
      tokensPerSecond: providerConfig.tokensPerSecond,
      maxContext: providerConfig.maxContext
    })
  )
  try {
    const chain = await runtime.runPromise(Effect.service(Chain))
    const provider = await providerRuntime.runPromise(Effect.service(ProviderServer.ProviderServer))
    const router = `http://127.0.0.1:${port}`
    const signer = simulationAccount("bench-1")
    await fetch(`${router}/v1/admin/providers`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({
        provider_id: "bench-1",
        signer: signer.address,
        base_url: provider.baseUrl,
        dialect: "openai"
      })
    })
    const postQuote = async () => {
      const quote = await Effect.runPromise(freshQuote(providerConfig, providerConfig.offers[0]!, signer))
      await fetch(`${router}/provider/quotes`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(quote)
      })
    }
    await postQuote()
    const refresher = setInterval(postQuote, 5_000)

    const account = privateKeyToAccount(chain.demoWallets[0]!.privateKey!)
    const client = new x402Client()
      .register(chain.network, new ExactEvmScheme(account))
      .setSpendControls(false)
    const payingFetch = wrapFetchWithPayment(fetch, client)
    const http = new x402HTTPClient(client)
    // An `upto` payer (its own demo wallet): Permit2 approved once, the official client with only
    // `UptoEvmScheme` registered, so it picks the `upto` entry of the 402.
    const uptoAccount = privateKeyToAccount(chain.demoWallets[1]!.privateKey!)
    const uptoWallet = createWalletClient({
      account: uptoAccount,
      chain: chain.publicClient.chain,
      transport: viemHttp(chain.rpcUrl)
    }).extend(publicActions)
    await uptoWallet.waitForTransactionReceipt({
      hash: await uptoWallet.sendTransaction(createPermit2ApprovalTx(chain.token))
    })
    const uptoHttp = new x402HTTPClient(
      new x402Client().register(chain.network, new UptoEvmScheme(uptoAccount)).setSpendControls(false)
    )
    /** A signed PAYMENT-SIGNATURE for this body, obtained outside the timed section. */
    const signedFor = async (payload: unknown, client: x402HTTPClient = http) => {
      const unpaid = await fetch(`${router}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(payload)
      })
      await unpaid.text()
      const required = client.getPaymentRequiredResponse((name) => unpaid.headers.get(name))
      const paymentPayload = await client.createPaymentPayload(required)
      return client.encodePaymentSignatureHeader(paymentPayload)
    }
    const body = (i: number) => ({
      model: "chat-small",
      messages: [{ role: "user", content: `benchmark round ${i}` }],
      max_tokens: 16,
      stream: true
    })

    // Warm up both paths (JIT, connection pools, prepared statements).
    for (let i = 0; i < 5; i++) {
      await firstContentMs(fetch, `${provider.baseUrl}/v1/chat/completions`, {
        ...body(i),
        model: "chat-small"
      })
      await firstContentMs(payingFetch, `${router}/v1/chat/completions`, body(i))
      const upto = await signedFor(body(6000 + i), uptoHttp)
      await firstContentMs(fetch, `${router}/v1/chat/completions`, body(6000 + i), upto)
    }
    // A funded key: the same paid path without x402 verification (no signature, no chain reads).
    const creditKey = `svc_ck_bench_${Date.now()}`
    await runtime.runPromise(
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const wallet = "0x00000000000000000000000000000000000be4c4"
        yield* sql`INSERT INTO wallets (wallet, invited) VALUES (${wallet}, true) ON CONFLICT DO NOTHING`
        yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${wallet}, 1000000000000)
                   ON CONFLICT (wallet) DO UPDATE SET available = 1000000000000`
        yield* sql`INSERT INTO api_keys (key_id, wallet, label, kind, key_hash, budget)
                   VALUES ('key_bench', ${wallet}, 'bench', 'credit', ${hashSecret(creditKey)}, 1000000000000)`
      })
    )
    for (let i = 0; i < 5; i++) {
      await firstContentMs(fetch, `${router}/v1/chat/completions`, body(4000 + i), {
        "x-credit-key": creditKey
      })
    }

    spans.reset()
    const direct: Array<number> = []
    const keyed: Array<number> = []
    const routed: Array<number> = []
    const routedUpto: Array<number> = []
    const withQuote: Array<number> = []
    const directStream: Array<number> = []
    const routedStream: Array<number> = []
    for (let i = 0; i < ROUNDS; i++) {
      direct.push(await firstContentMs(fetch, `${provider.baseUrl}/v1/chat/completions`, body(1000 + i)))
      directStream.push(lastStream)
      const headers = await signedFor(body(2000 + i))
      routed.push(await firstContentMs(fetch, `${router}/v1/chat/completions`, body(2000 + i), headers))
      routedStream.push(lastStream)
      const uptoHeaders = await signedFor(body(7000 + i), uptoHttp)
      routedUpto.push(
        await firstContentMs(fetch, `${router}/v1/chat/completions`, body(7000 + i), uptoHeaders)
      )
      withQuote.push(await firstContentMs(payingFetch, `${router}/v1/chat/completions`, body(3000 + i)))
      keyed.push(
        await firstContentMs(fetch, `${router}/v1/chat/completions`, body(5000 + i), {
          "x-credit-key": creditKey
        })
      )
    }
    clearInterval(refresher)
    const overhead = routed.map((r, i) => r - direct[i]!)
    process.stdout.write(
      [
        `time to first token, ${ROUNDS} rounds, provider TTFT set to 40 ms`,
        `  provider direct (baseline)   ${summary(direct)}`,
        `  through the router, paid     ${summary(routed)}`,
        `  router overhead, paid call   ${summary(overhead)}`,
        "    (auction, EIP-712 verification, nonce and balance reads, reservation, capacity lease, relay)",
        `  through the router, paid upto ${summary(routedUpto)}`,
        `  router overhead, upto        ${summary(routedUpto.map((u, i) => u - direct[i]!))}`,
        "    (x402 upto: Permit2 witness signature, nonce, balance and allowance reads, ceiling reservation; settled after)",
        `  incl. the 402 round trip     ${summary(withQuote)}`,
        "    (what @x402/fetch sees: an unpaid call answered 402, signing, then the paid call)",
        `  through the router, funded key ${summary(keyed)}`,
        `  router overhead, funded key  ${summary(keyed.map((k, i) => k - direct[i]!))}`,
        "    (the same path without x402 verification: auction, one-statement reservation, lease, relay)",
        `  first-to-last token, direct  ${summary(directStream)}`,
        `  first-to-last token, routed  ${summary(routedStream)}`,
        "    (deltas are relayed as they arrive: the spread of the stream is the provider's own)",
        `  rss ${(process.memoryUsage().rss / 1024 / 1024).toFixed(0)} MiB`,
        "  where a paid call's time goes (mean span duration, ms):",
        ...spanTable(spans)
      ].join("\n") + "\n"
    )
  } finally {
    await runtime.dispose()
    await providerRuntime.dispose()
    rmSync(dataDir, { recursive: true, force: true })
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${error}\n`)
    process.exit(1)
  }
)
