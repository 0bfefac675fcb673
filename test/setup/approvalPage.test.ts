import { readFileSync, statSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { errorCode, invite, signedCall } from "../keys/support.ts"
import { openPage, TestBrowser } from "../support/Browser.ts"
import { waitForBook } from "../support/Pay.ts"
import { call, postJson, type Reply, RouterUrl, routerWithFleet } from "../support/Router.ts"
import { scratchDirForTest } from "../support/Scratch.ts"
import { printedUserCode, runCli } from "./cli.ts"

/** The router with its fleet, polled every second (the default 5 s would only make the test wait). */
const router = routerWithFleet().pipe(
  Layer.provide(
    ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ AGENT_SETUP_INTERVAL_SECONDS: "1" }), {
      asPrimary: true
    })
  )
)

const chat = { model: "chat-small", messages: [{ role: "user", content: "Hello" }], max_tokens: 16 }

describe("svc-setup, the approval page in a real browser, and the key it delivers", () => {
  layer(Layer.merge(router, TestBrowser.layer), { timeout: 180_000, excludeTestServices: true })((it) => {
    it.effect(
      "the command waits, the wallet lowers the budget and signs in the page, the command writes the key; the key spends to its cap and the wallet revokes it",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const base = yield* RouterUrl
          const sql = yield* SqlClient.SqlClient
          yield* waitForBook
          const wallet = privateKeyToAccount(chain.demoWallets[1]!.privateKey!)
          yield* invite(wallet.address)
          // Prepaid credit well above any cap below: the key's cap is what must stop the spending.
          yield* sql`INSERT INTO wallet_balances (wallet, available) VALUES (${wallet.address.toLowerCase()}, 100000000)`

          const preview = (yield* postJson("/v1/routing/preview", chat)).json as {
            profiles: Array<{ profile: string; winner: { worst_case_charge: number } }>
          }
          const worstCase = preview.profiles.find((p) => p.profile === "as-sent")!.winner.worst_case_charge
          const asked = worstCase * 10
          const approvedCap = worstCase * 3 + Math.floor(worstCase / 2)
          const usdc = (base: number) => (base / 1_000_000).toFixed(6)

          const configDir = join(scratchDirForTest("svc-setup-"), "config")
          const cli = yield* runCli([
            "--router",
            base,
            "--harness",
            "claude-code",
            "--budget",
            usdc(asked),
            "--expires",
            "2d",
            "--config-dir",
            configDir,
            "--no-qr"
          ])
          const userCode = yield* printedUserCode(cli)
          assert.include(cli.stdout(), `/setup?code=${userCode}`)

          // A test EIP-1193 wallet in the page, signing with the dev wallet's key outside the page.
          const signed: Array<string> = []
          const responses: Array<string> = []
          const page = yield* openPage(async (page) => {
            await page.exposeFunction("__svcTestSign", async (json: string) => {
              signed.push(json)
              return wallet.signTypedData(JSON.parse(json))
            })
            // Like a browser wallet: on another chain (mainnet) until asked to switch, and refusing to sign
            // typed data for a chain other than the active one.
            await page.addInitScript((address: string) => {
              const sign = (globalThis as unknown as { __svcTestSign: (json: string) => Promise<string> })
                .__svcTestSign
              let chainId = "0x1"
              ;(globalThis as unknown as { ethereum: unknown }).ethereum = {
                request: async ({ method, params }: { method: string; params?: Array<unknown> }) => {
                  if (method === "eth_requestAccounts" || method === "eth_accounts") return [address]
                  if (method === "eth_chainId") return chainId
                  if (method === "wallet_switchEthereumChain") {
                    chainId = (params![0] as { chainId: string }).chainId
                    return null
                  }
                  if (
                    method === "eth_signTypedData_v4" &&
                    String(params?.[0]).toLowerCase() === address.toLowerCase()
                  ) {
                    const json = String(params![1])
                    const domainChain = (JSON.parse(json) as { domain: { chainId: number } }).domain.chainId
                    if (`0x${domainChain.toString(16)}` !== chainId) {
                      throw Object.assign(new Error("chainId does not match the active chain"), {
                        code: -32602
                      })
                    }
                    return sign(json)
                  }
                  throw Object.assign(new Error(`unsupported ${method}`), { code: 4200 })
                }
              }
            }, wallet.address)
            page.on("response", (response) => {
              void response.text().then(
                (text) => responses.push(text),
                () => undefined
              )
            })
          })
          yield* Effect.promise(() => page.goto(`${base}/setup?code=${userCode}`))
          yield* Effect.promise(() => page.waitForSelector("#terms:not([hidden])"))
          const summary = yield* Effect.promise(() => page.textContent("#summary"))
          assert.include(summary, "Claude Code")
          assert.include(summary, `${usdc(asked)} USDC`)
          assert.strictEqual(yield* Effect.promise(() => page.textContent("#user-code")), userCode)

          yield* Effect.promise(() => page.fill("#budget", usdc(approvedCap)))
          yield* Effect.promise(() => page.click("#approve"))
          yield* Effect.promise(() =>
            page.waitForSelector("#result.ok >> text=Approved", { timeout: 30_000 })
          )
          assert.strictEqual(signed.length, 1)
          const message = (JSON.parse(signed[0]!) as { message: Record<string, string> }).message
          assert.strictEqual(message.wallet, wallet.address)
          assert.strictEqual(message.budget, String(approvedCap))
          assert.strictEqual(message.userCode, userCode)

          // The command gets its key, writes it owner-only and never prints it.
          assert.strictEqual(yield* cli.exitCode, 0, cli.stderr())
          const envFile = join(configDir, "claude-code.env")
          assert.strictEqual(statSync(configDir).mode & 0o777, 0o700)
          assert.strictEqual(statSync(envFile).mode & 0o777, 0o600)
          const secret = /^export SVC_CREDIT_KEY='(svc_ck_[A-Za-z0-9_-]+)'$/m.exec(
            readFileSync(envFile, "utf8")
          )![1]!
          assert.notInclude(cli.stdout() + cli.stderr(), secret)
          assert.include(cli.stdout(), `${secret.slice(0, 11)}…${secret.slice(-4)}`)
          assert.include(cli.stdout(), `OpenAI-compatible base URL:    ${base}/v1`)
          assert.include(cli.stdout(), `Anthropic-compatible base URL: ${base}`)
          assert.include(cli.stdout(), `source ${envFile}`)
          for (const text of responses) assert.notInclude(text, "svc_ck_", "the page never sees a credit key")

          // The key spends like any wallet key, down to its cap, and no further.
          const spend = () =>
            call("/v1/chat/completions", {
              method: "POST",
              headers: { "content-type": "application/json", "x-credit-key": secret },
              body: JSON.stringify(chat)
            })
          const remaining: Array<number> = []
          let refused: Reply | undefined
          for (let i = 0; i < 20 && refused === undefined; i++) {
            const reply = yield* spend()
            if (reply.status === 200) remaining.push(Number(reply.headers.get("x-key-budget-remaining")))
            else refused = reply
          }
          assert.strictEqual(refused?.status, 402, refused?.text)
          assert.strictEqual((refused!.json as { code?: string }).code, "key_budget_exhausted")
          assert.isAtLeast(remaining.length, 3)
          assert.deepStrictEqual(
            [...remaining].sort((a, b) => b - a),
            remaining,
            "x-key-budget-remaining only falls"
          )
          const listed = yield* signedCall(wallet, "GET", "/v1/keys")
          const [key] = (
            listed.json as {
              data: Array<{
                budget: number
                spent: number
                reserved: number
                kind: string
                expires_at: number
              }>
            }
          ).data
          assert.strictEqual(key!.kind, "credit")
          assert.strictEqual(key!.budget, approvedCap)
          assert.isAtMost(key!.spent + key!.reserved, approvedCap)
          assert.isAbove(key!.expires_at, Date.now() / 1000 + 2 * 86_400 - 600)

          // The wallet revokes it: the next request is refused before any money moves.
          const keyId = (listed.json as { data: Array<{ id: string }> }).data[0]!.id
          assert.strictEqual((yield* signedCall(wallet, "DELETE", `/v1/keys/${keyId}`)).status, 200)
          const revoked = yield* spend()
          assert.strictEqual(revoked.status, 401)
          assert.strictEqual(errorCode(revoked.json), "invalid_credit_key")
        })
    )
  })
})
