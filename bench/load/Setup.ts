/**
 * The router a load run drives, set up as `npm run bench:load` sets it up: started as `npm start` runs it
 * (embedded Postgres and Anvil in `DATA_DIR`, no simulated fleet), two registered providers quoting the
 * mock at fixed prices (refreshed every 5 s), a funded credit key; and the signed x402 payments a run sends.
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { ExactEvmScheme } from "@x402/evm/exact/client"
import { x402Client, x402HTTPClient } from "@x402/fetch"
import { Effect } from "effect"
import { demoWalletAccounts } from "../../src/chain/DevAccounts.ts"
import { type ProviderConfig, simulationAccount } from "../../src/devnet/fleet/FleetConfig.ts"
import { signQuote, unsignedQuote } from "../../src/devnet/fleet/Quotes.ts"
import { type Children, freePort, post, routerArgs } from "../support/Children.ts"
import { fundCreditKey } from "../support/CreditKeys.ts"
// Router setup: two providers quoting the mock, a funded key

export const providers: ReadonlyArray<ProviderConfig> = ["bench-a", "bench-b"].map((providerId, i) => ({
  providerId,
  dialect: "openai",
  offers: [{ modelClass: "chat-small", priceIn: 100_000 + i * 10_000, priceOut: 400_000 + i * 40_000 }],
  ttftMs: 0,
  tokensPerSecond: 1_000_000,
  capacityRps: 1_000_000,
  maxContext: 32_000
}))

/** Quotes with the offer's own prices (no random move): a signed x402 payment stays good all run. */
export const postQuotes = (router: string) =>
  Promise.all(
    providers.map(async (provider) => {
      const offer = provider.offers[0]!
      const nowSeconds = Math.floor(Date.now() / 1000)
      const quote = await Effect.runPromise(
        signQuote(
          simulationAccount(provider.providerId),
          unsignedQuote(provider, offer, {
            quoteId: `q-${provider.providerId}-${nowSeconds}-${Math.random().toString(16).slice(2, 10)}`,
            nowSeconds,
            deltaIn: 0,
            deltaOut: 0
          })
        )
      )
      await post(`${router}/provider/quotes`, quote)
    })
  )

/**
 * The embedded Postgres as the router reaches it, from its lock file as any operator would find it: its port
 * (line 4) and its socket folder (line 5) as `host` when it has one, which libpq, psql and @effect/sql-pg
 * take over the URL's host.
 */
export const embeddedDatabaseUrl = (dataDir: string) => {
  const lines = readFileSync(join(dataDir, "postgres", "postmaster.pid"), "utf8").split("\n")
  const url = new URL(`postgres://postgres:postgres@127.0.0.1:${lines[3]!.trim()}/router`)
  const socketDir = lines[4]?.trim()
  if (socketDir !== undefined && socketDir !== "") url.searchParams.set("host", socketDir)
  return url.toString()
}

export const chatBody = (content: string, stream: boolean) =>
  JSON.stringify({ model: "chat-small", messages: [{ role: "user", content }], max_tokens: 16, stream })

/** `count` signed x402 payments for one body, made before the timed section (client work, not router). */
export const x402Payments = async (router: string, body: string, count: number) => {
  const client = new x402Client()
  const http = new x402HTTPClient(client)
  const unpaid = await fetch(`${router}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body
  })
  await unpaid.text()
  const required = http.getPaymentRequiredResponse((name) => unpaid.headers.get(name))
  const network = required.accepts[0]!.network
  const payers = demoWalletAccounts().map(
    (account) =>
      new x402HTTPClient(
        new x402Client().register(network, new ExactEvmScheme(account)).setSpendControls(false)
      )
  )
  const headers: Array<Record<string, string>> = []
  for (let i = 0; i < count; i++) {
    const payer = payers[i % payers.length]!
    headers.push(payer.encodePaymentSignatureHeader(await payer.createPaymentPayload(required)))
  }
  return headers
}

const TOKEN = "bench-load-operator"

/**
 * Starts the router in `dataDir` (its `DATA_DIR`), as `npm start` runs it, and readies it: `beforeReady` runs
 * while it starts (a caller's other process), then the providers are registered, quoted (and re-quoted
 * every 5 s until `stop`), and a credit key funded.
 */
export const startRouter = async (
  children: Children,
  options: {
    /** Node options before `npm start`'s own (a heap-snapshot signal, say). */
    readonly nodeArgs?: ReadonlyArray<string>
    readonly dataDir: string
    readonly logFile: string
    readonly mock: string
    readonly log: (line: string) => void
    readonly beforeReady?: () => Promise<void>
  }
) => {
  const routerPort = await freePort()
  const process_ = children.start(
    "router",
    [...(options.nodeArgs ?? []), ...routerArgs()],
    {
      PORT: String(routerPort),
      HOST: "127.0.0.1",
      DATA_DIR: options.dataDir,
      SIMULATED_FLEET: "false",
      OPERATOR_TOKEN: TOKEN,
      DRAIN_TIMEOUT_SECONDS: "2"
    },
    options.logFile
  )
  const router = `http://127.0.0.1:${routerPort}`
  await options.beforeReady?.()
  await children.waitFor("the router", async () => (await fetch(`${router}/ready`)).ok, 180)
  options.log("router ready")
  for (const provider of providers) {
    await post(
      `${router}/v1/admin/providers`,
      {
        provider_id: provider.providerId,
        signer: simulationAccount(provider.providerId).address,
        base_url: options.mock,
        dialect: "openai"
      },
      { authorization: `Bearer ${TOKEN}` }
    )
  }
  await postQuotes(router)
  const refresher = setInterval(
    () => postQuotes(router).catch((e) => options.log(`quote refresh: ${e}`)),
    5_000
  )
  const databaseUrl = embeddedDatabaseUrl(options.dataDir)
  const { secret: creditKey } = await fundCreditKey(databaseUrl, {
    keyId: "key_bench_load",
    wallet: "0x00000000000000000000000000000000000be4c4",
    amount: 1_000_000_000_000_000
  })
  return { router, process: process_, creditKey, databaseUrl, stop: () => clearInterval(refresher) }
}
