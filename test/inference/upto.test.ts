import { assert, describe, layer } from "@effect/vitest"
import type { PaymentRequirements } from "@x402/core/types"
import { createPermit2ApprovalTx, UptoEvmScheme } from "@x402/evm/upto/client"
import { x402Client } from "@x402/fetch"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import OpenAI from "openai"
import { createWalletClient, http, publicActions } from "viem"
import { type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts"
import { Chain } from "../../src/chain/Chain.ts"
import { decodeX402Header } from "../../src/domain/X402.ts"
import { officialPayingFetch, providerRequests, receiptWhen, waitForBook } from "../support/Pay.ts"
import { call, postJson, RouterUrl, routerWithFleet } from "../support/Router.ts"

interface Body402 {
  readonly code: string
  readonly error: string
  readonly accepts: ReadonlyArray<PaymentRequirements & { maxAmountRequired: string }>
}

interface Svc {
  readonly type?: string
  readonly request_id: string
  readonly charged: number
  readonly authorized: number
}

const chat = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "chat-small",
  messages: [{ role: "user", content }],
  max_tokens: 32,
  ...extra
})

/** Demo wallet `index` approves Permit2 once, with the helper `@x402/evm` exports for it. */
const approvePermit2 = (account: PrivateKeyAccount) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const wallet = createWalletClient({
      account,
      chain: chain.publicClient.chain,
      transport: http(chain.rpcUrl)
    }).extend(publicActions)
    const hash = yield* Effect.promise(() => wallet.sendTransaction(createPermit2ApprovalTx(chain.token)))
    yield* Effect.promise(() => wallet.waitForTransactionReceipt({ hash }))
  })

/** An agent that opts into `upto`: the official client with only `UptoEvmScheme` registered. */
const uptoPayer = (index: number) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const base = yield* RouterUrl
    const account = privateKeyToAccount(chain.demoWallets[index]!.privateKey!)
    const client = new x402Client().register(chain.network, new UptoEvmScheme(account)).setSpendControls({
      allowedAssets: [{ network: chain.network, asset: chain.token, maxAmountPerPayment: "10000000" }]
    })
    const payingFetch = officialPayingFetch(client)
    const openai = new OpenAI({ apiKey: "x402", baseURL: `${base}/v1`, fetch: payingFetch, maxRetries: 0 })
    return { chain, account, openai }
  })

/**
 * A `PAYMENT-SIGNATURE` the official upto client signs for `requirements` (which a test may bend), echoing
 * `accepted` (the requirements signed, unless a test echoes the quote over a bent signature).
 */
const officialUptoHeader = (
  account: PrivateKeyAccount,
  requirements: PaymentRequirements,
  accepted: PaymentRequirements = requirements
) =>
  Effect.promise(async () => {
    const created = await new UptoEvmScheme(account).createPaymentPayload(2, requirements)
    return Buffer.from(JSON.stringify({ x402Version: 2, accepted, payload: created.payload })).toString(
      "base64"
    )
  })

const quoteOf = (body: unknown) =>
  Effect.gen(function* () {
    const reply = yield* postJson("/v1/chat/completions", body)
    assert.strictEqual(reply.status, 402)
    return reply.json as Body402
  })

describe("x402 upto: authorize a ceiling, settle the metered actual (official client, openai SDK)", () => {
  layer(routerWithFleet({ epochSeconds: 2 }), { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.effect("a completion's 402 offers exact then upto; a session's offers exact only", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const chain = yield* Chain
        const body = yield* quoteOf(chat("hello"))
        assert.deepStrictEqual(
          body.accepts.map((a) => a.scheme),
          ["exact", "upto"]
        )
        const [exact, upto] = body.accepts
        assert.strictEqual(upto!.amount, exact!.amount)
        assert.strictEqual(upto!.payTo, chain.treasury)
        assert.strictEqual(upto!.asset, chain.token)
        assert.strictEqual(upto!.maxTimeoutSeconds, 3600)
        assert.strictEqual(upto!.extra.facilitatorAddress, chain.routerSigner)
        const reply = yield* postJson("/v1/chat/completions", chat("hello"))
        const header = decodeX402Header(reply.headers.get("payment-required")!) as Body402
        assert.deepStrictEqual(header.accepts, body.accepts)

        const session = yield* quoteOf(
          chat("hello", { model: "chat-medium", routing: { session_id: "sess-upto-quote" } })
        )
        assert.deepStrictEqual(
          session.accepts.map((a) => a.scheme),
          ["exact"]
        )
      })
    )

    it.effect("non-streaming: the payer's balance drops by exactly the receipt's charge", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { chain, account, openai } = yield* uptoPayer(1)
        yield* approvePermit2(account)
        const before = yield* chain.balanceOf(account.address)
        const { data, response } = yield* Effect.promise(() =>
          openai.chat.completions
            .create({
              model: "chat-medium",
              messages: [{ role: "user", content: "Say something about ceilings." }],
              max_tokens: 64
            })
            .withResponse()
        )
        const requestId = response.headers.get("x-request-id")!
        assert.isAbove(data.choices[0]!.message.content!.length, 0)
        const cost = (data.usage as unknown as { cost: number }).cost
        const settled = yield* receiptWhen(requestId, (r) => r.receipt.settlement === "landed")
        assert.strictEqual(settled.receipt.charged, Math.round(cost * 1_000_000))
        // The ceiling covers the worst case (all 64 output tokens); the actual is less.
        assert.isBelow(settled.receipt.charged, settled.receipt.authorized)
        assert.isAbove(settled.receipt.charged, 0)
        assert.match(settled.receipt.payment_ref, /^0x[0-9a-f]{64}$/)
        assert.isNull(settled.receipt.refund_ref)
        const after = yield* chain.balanceOf(account.address)
        assert.strictEqual(before - after, BigInt(settled.receipt.charged))

        // The settlement transaction moved exactly the charge, payer → treasury, through the proxy.
        const tx = yield* Effect.promise(() =>
          chain.publicClient.getTransactionReceipt({ hash: settled.receipt.payment_ref as `0x${string}` })
        )
        assert.strictEqual(tx.to?.toLowerCase(), chain.uptoProxy.toLowerCase())

        // No refund is due or issued; the economics show the actual beside the ceiling.
        const sql = yield* SqlClient.SqlClient
        const refunds = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM refunds
                                                   WHERE request_id = ${requestId}`
        assert.strictEqual(refunds[0]!.n, 0)
        const economics = (yield* call(`/v1/analytics/requests/${requestId}`)).json as {
          charged: number
          authorized: number
        }
        assert.strictEqual(economics.charged, settled.receipt.charged)
        assert.strictEqual(economics.authorized, settled.receipt.authorized)
      })
    )

    it.effect("streaming: the last chunk's charge is what left the payer's wallet", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { chain, account, openai } = yield* uptoPayer(2)
        yield* approvePermit2(account)
        const before = yield* chain.balanceOf(account.address)
        const chunks = yield* Effect.promise(async () => {
          const stream = await openai.chat.completions.create({
            model: "cheapest",
            messages: [{ role: "user", content: "Stream a short answer." }],
            max_tokens: 48,
            stream: true
          })
          const out: Array<{ svc?: Svc }> = []
          for await (const chunk of stream) out.push(chunk as unknown as { svc?: Svc })
          return out
        })
        const last = chunks[chunks.length - 1]!.svc!
        assert.strictEqual(last.type, "usage")
        const settled = yield* receiptWhen(last.request_id, (r) => r.receipt.settlement === "landed")
        assert.strictEqual(settled.receipt.charged, last.charged)
        assert.strictEqual(settled.receipt.authorized, last.authorized)
        const after = yield* chain.balanceOf(account.address)
        assert.strictEqual(before - after, BigInt(last.charged))
      })
    )

    it.effect("refusals before inference move no money and call no provider", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const chain = yield* Chain
        const account = privateKeyToAccount(chain.demoWallets[3]!.privateKey!)
        const unapproved = privateKeyToAccount(chain.demoWallets[4]!.privateKey!)
        yield* approvePermit2(account)
        const quote = yield* quoteOf(chat("hello"))
        const upto = quote.accepts[1]!
        const balances = () =>
          Effect.all([chain.balanceOf(account.address), chain.balanceOf(unapproved.address)])
        const before = yield* balances()
        const calls = yield* providerRequests

        const refused = (
          body: unknown,
          header: string,
          code: string,
          error: RegExp
        ): Effect.Effect<Body402, never, RouterUrl> =>
          Effect.gen(function* () {
            const reply = yield* postJson("/v1/chat/completions", body, { "payment-signature": header })
            assert.strictEqual(reply.status, 402, reply.text)
            const refusal = reply.json as Body402
            assert.strictEqual(refusal.code, code, reply.text)
            assert.match(refusal.error, error, reply.text)
            assert.isAbove(refusal.accepts.length, 0)
            return refusal
          })

        // A session's budget takes exact only: another 402, with accepts to sign exact.
        const sessionBody = chat("hello", {
          model: "chat-medium",
          routing: { session_id: "sess-upto-refused" }
        })
        const sessionQuote = yield* quoteOf(sessionBody)
        const forSession = yield* officialUptoHeader(account, {
          ...upto,
          amount: sessionQuote.accepts[0]!.amount
        })
        const wrong = yield* refused(sessionBody, forSession, "wrong_scheme", /upto scheme is not accepted/)
        assert.deepStrictEqual(
          wrong.accepts.map((a) => a.scheme),
          ["exact"]
        )

        // The signed permit is bent; the envelope echoes the quote (the router checks both).
        const bent = (changes: Partial<PaymentRequirements>) =>
          officialUptoHeader(account, { ...upto, ...changes }, upto)
        yield* refused(
          chat("hello"),
          yield* bent({ payTo: account.address }),
          "payment_invalid",
          /witness.to must be the treasury/
        )
        yield* refused(
          chat("hello"),
          yield* bent({ extra: { ...upto.extra, facilitatorAddress: account.address } }),
          "payment_invalid",
          /witness.facilitator must be the router/
        )
        yield* refused(
          chat("hello"),
          yield* bent({ asset: chain.anchor }),
          "payment_invalid",
          /permitted.token must be the asset/
        )
        yield* refused(
          chat("hello"),
          yield* officialUptoHeader(account, { ...upto, payTo: account.address }),
          "payment_invalid",
          /accepted.payTo must be the treasury/
        )
        // A ceiling below the worst case (a request whose worst case is well above the solo settlement
        // floor): half of it, so that the quote moving a little in between cannot make it enough.
        const long = chat("hello", { model: "chat-large", max_tokens: 4000 })
        const longUpto = (yield* quoteOf(long)).accepts[1]!
        assert.isAbove(Number(longUpto.amount), 2 * 10_000)
        yield* refused(
          long,
          yield* officialUptoHeader(account, { ...longUpto, amount: String(BigInt(longUpto.amount) / 2n) }),
          "payment_invalid",
          /below the quoted maximum/
        )
        yield* refused(
          chat("hello"),
          yield* bent({ amount: "9999" }),
          "solo_settle_floor",
          /below the solo settlement floor/
        )
        yield* refused(
          chat("hello"),
          yield* bent({ maxTimeoutSeconds: 600 }),
          "payment_invalid",
          /deadline must be at least 1800 seconds ahead/
        )
        yield* refused(
          chat("hello"),
          yield* bent({ maxTimeoutSeconds: 3 * 3600 }),
          "payment_invalid",
          /deadline must be at most 7200 seconds ahead/
        )
        yield* refused(
          chat("hello"),
          yield* officialUptoHeader(unapproved, upto),
          "payment_invalid",
          /Permit2 allowance is below the ceiling/
        )

        assert.deepStrictEqual(yield* balances(), before)
        assert.strictEqual(yield* providerRequests, calls)
      })
    )

    it.effect("a settled authorization cannot pay twice: its replay is refused before inference", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const chain = yield* Chain
        const account = privateKeyToAccount(chain.demoWallets[5]!.privateKey!)
        yield* approvePermit2(account)
        const quote = yield* quoteOf(chat("hello"))
        const header = yield* officialUptoHeader(account, quote.accepts[1]!)
        const paid = yield* postJson("/v1/chat/completions", chat("hello"), { "payment-signature": header })
        assert.strictEqual(paid.status, 200, paid.text)
        const requestId = paid.headers.get("x-request-id")!
        const settled = yield* receiptWhen(requestId, (r) => r.receipt.settlement === "landed")
        const before = yield* chain.balanceOf(account.address)
        const calls = yield* providerRequests
        const replay = yield* postJson("/v1/chat/completions", chat("hello"), { "payment-signature": header })
        assert.strictEqual(replay.status, 402)
        assert.strictEqual((replay.json as Body402).code, "payment_invalid")
        assert.strictEqual(yield* chain.balanceOf(account.address), before)
        assert.strictEqual(yield* providerRequests, calls)
        // One transfer for the authorization: the ledger's settled row is the charge.
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ amount: string }>`SELECT amount::text FROM ledger_entries
                                                   WHERE request_id = ${requestId} AND kind = 'settled'`
        assert.deepStrictEqual(
          rows.map((r) => r.amount),
          [String(settled.receipt.charged)]
        )
      })
    )
  })
})
