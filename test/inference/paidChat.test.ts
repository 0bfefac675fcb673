import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer, Logger } from "effect"
import { SqlClient } from "effect/sql"
import OpenAI from "openai"
import { type Address, erc20Abi, type Hex, parseEventLogs, verifyTypedData } from "viem"
import { payer, waitFor, waitForBook } from "../support/Pay.ts"
import { call, RouterUrl, routerWithFleet } from "../support/Router.ts"

interface SvcBid {
  readonly rank: number
  readonly provider: string
  readonly outcome: string
}
interface Svc {
  readonly type?: string
  readonly request_id: string
  readonly charged: number
  readonly authorized: number
  readonly process: ReadonlyArray<{ step: string }>
  readonly links: { receipt: string }
  readonly auction: {
    mechanism: string
    version: string
    bids: ReadonlyArray<SvcBid>
    winner: { provider: string }
    clear: { price_in: number }
  }
}
interface Chunk {
  readonly choices: ReadonlyArray<{ delta?: { content?: string } }>
  readonly usage?: { completion_tokens: number }
  readonly svc: Svc
}

type ReceiptReply = {
  receipt: Record<string, unknown> & {
    charged: number
    authorized: number
    payment_ref: string
    refund_ref: string | null
    settlement: string
    status: string
    wallet: string
  }
  final: boolean
  signature: Hex | null
  signer: Address
  typed_data: {
    domain: Record<string, unknown>
    types: Record<string, unknown>
    primaryType: string
    message: Record<string, unknown>
  }
}

const receiptWhere = (id: string, predicate: (r: ReceiptReply) => boolean) =>
  waitFor(
    `receipt ${id}`,
    Effect.map(call(`/v1/receipts/${id}`), (r) =>
      r.status === 200 && predicate(r.json as ReceiptReply) ? (r.json as ReceiptReply) : undefined
    )
  )

const clients = Effect.gen(function* () {
  const base = yield* RouterUrl
  const { chain, account, payingFetch } = yield* payer(0)
  const openai = new OpenAI({ apiKey: "x402", baseURL: `${base}/v1`, fetch: payingFetch, maxRetries: 0 })
  return { chain, account, openai }
})

/** Every log line the router writes during this file, to prove no prompt reaches a log. */
const logLines: Array<string> = []
const captureLogs = Logger.layer(
  [
    Logger.map(Logger.formatLogFmt, (line) => {
      logLines.push(line)
    })
  ],
  { mergeWithExisting: true }
)

describe("a paid chat completion end to end (official openai SDK over @x402/fetch)", () => {
  layer(routerWithFleet({ epochSeconds: 2 }).pipe(Layer.provide(captureLogs)), {
    excludeTestServices: true,
    timeout: 180_000
  })((it) => {
    it.effect("non-streaming: 402, sign, serve, settle on chain, signed receipt, refund at epoch close", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { chain, account, openai } = yield* clients
        const before = yield* chain.balanceOf(account.address)
        const { data, response } = yield* Effect.promise(() =>
          openai.chat.completions
            .create({
              model: "chat-medium",
              messages: [{ role: "user", content: "Say something about auctions." }],
              max_tokens: 48
            })
            .withResponse()
        )
        const requestId = response.headers.get("x-request-id")!
        assert.match(requestId, /^req_/)
        assert.strictEqual(data.object, "chat.completion")
        assert.isAbove(data.choices[0]!.message.content!.length, 0)
        const svc = (data as unknown as { svc: Svc }).svc
        assert.strictEqual(svc.request_id, requestId)
        assert.strictEqual(svc.auction.mechanism, "second-score")
        assert.match(svc.auction.version, /^second-score\/\d+$/)
        assert.deepStrictEqual(
          svc.process.map((p) => p.step),
          ["route", "rfq", "award", "clear", "serve"]
        )
        assert.strictEqual(svc.links.receipt, `/v1/receipts/${requestId}`)
        assert.isAtLeast(svc.auction.bids.length, 2)
        for (const bid of svc.auction.bids.filter((b) => b.outcome === "lost")) {
          assert.match(bid.provider, /^rival-\d+$/)
        }
        assert.strictEqual(svc.auction.winner.provider, svc.auction.bids[0]!.provider)
        assert.strictEqual(response.headers.get("x-routing-model"), "chat-medium")
        assert.strictEqual(response.headers.get("x-clear-price-in"), String(svc.auction.clear.price_in))
        assert.isNotNull(response.headers.get("payment-response"))
        assert.isNotNull(response.headers.get("x-stream-token"))
        const usage = data.usage as unknown as {
          prompt_tokens: number
          completion_tokens: number
          cost: number
        }
        assert.isAbove(usage.completion_tokens, 0)

        // Settlement lands on chain; the receipt verifies with viem alone.
        const settled = yield* receiptWhere(requestId, (r) => r.receipt.settlement === "landed")
        assert.isTrue(settled.final)
        assert.strictEqual(settled.receipt.wallet, account.address.toLowerCase())
        assert.isAtLeast(settled.receipt.authorized, settled.receipt.charged)
        assert.strictEqual(settled.receipt.charged, Math.round(usage.cost * 1_000_000))
        const valid = yield* Effect.promise(() =>
          verifyTypedData({
            address: settled.signer,
            signature: settled.signature!,
            ...(settled.typed_data as unknown as Omit<
              Parameters<typeof verifyTypedData>[0],
              "address" | "signature"
            >)
          })
        )
        assert.isTrue(valid)
        // The settlement transaction moved exactly the authorized amount, payer → treasury. The wallet's
        // balance is read separately: with 2 s epochs the refund may already be back by the time the
        // (asynchronously signed) receipt reads final, so it is the authorized amount out, or the charge.
        const settleTx = yield* Effect.promise(() =>
          chain.publicClient.getTransactionReceipt({ hash: settled.receipt.payment_ref as Hex })
        )
        const moved = parseEventLogs({ abi: erc20Abi, logs: settleTx.logs, eventName: "Transfer" })
        assert.deepStrictEqual(
          moved.map((l) => [l.args.from.toLowerCase(), l.args.to.toLowerCase(), l.args.value]),
          [[account.address.toLowerCase(), chain.treasury.toLowerCase(), BigInt(settled.receipt.authorized)]]
        )
        const afterSettle = yield* chain.balanceOf(account.address)
        assert.include(
          [BigInt(settled.receipt.authorized), BigInt(settled.receipt.charged)],
          before - afterSettle
        )

        // At epoch close the overage comes back in a batched transfer from the treasury.
        const refunded = yield* receiptWhere(requestId, (r) => r.receipt.refund_ref !== null)
        assert.match(refunded.receipt.refund_ref!, /^0x[0-9a-f]{64}$/)
        const afterRefund = yield* chain.balanceOf(account.address)
        assert.strictEqual(before - afterRefund, BigInt(refunded.receipt.charged))

        // The economics: every rival's counterfactual for the same tokens, fee split summing to the charge.
        const economics = (yield* call(`/v1/analytics/requests/${requestId}`)).json as {
          charged: number
          competitors: Array<{ label: string; charge: number }>
          fee_split: { router_fee: number; provider_share: number }
          second_score_premium: number
        }
        assert.strictEqual(economics.charged, refunded.receipt.charged)
        assert.strictEqual(
          economics.fee_split.router_fee + economics.fee_split.provider_share,
          economics.charged
        )
        const charges = economics.competitors.map((c) => c.charge)
        assert.deepStrictEqual(
          charges,
          [...charges].sort((a, b) => a - b)
        )
        assert.deepStrictEqual(
          economics.competitors.map((c) => c.label),
          economics.competitors.map((_, i) => `rival-${i + 1}`)
        )
      })
    )

    it.effect("streaming: the auction_cleared chunk first, deltas, usage with the charge", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { openai } = yield* clients
        const chunks = yield* Effect.promise(async () => {
          const stream = await openai.chat.completions.create({
            model: "cheapest",
            messages: [{ role: "user", content: "Stream a short answer." }],
            max_tokens: 32,
            stream: true
          })
          const out: Array<Chunk> = []
          for await (const chunk of stream) out.push(chunk as unknown as Chunk)
          return out
        })
        const first = chunks[0]!
        assert.deepStrictEqual(first.choices, [])
        assert.strictEqual(first.svc.type, "auction_cleared")
        assert.isAtLeast(first.svc.auction.bids.length, 2)
        const text = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("")
        assert.isAbove(text.length, 0)
        const last = chunks[chunks.length - 1]!
        assert.isAbove(last.usage!.completion_tokens, 0)
        assert.strictEqual(last.svc.type, "usage")
        assert.isAbove(last.svc.charged, 0)
        assert.isAtMost(last.svc.charged, last.svc.authorized)
      })
    )

    it.effect("privacy: a unique marker in a prompt is in no table and no log line", () =>
      Effect.gen(function* () {
        yield* waitForBook
        const { openai } = yield* clients
        const marker = `privacy-marker-${Math.random().toString(36).slice(2)}`
        yield* Effect.promise(() =>
          openai.chat.completions.create({
            model: "chat-small",
            messages: [{ role: "user", content: `Repeat ${marker}` }],
            max_tokens: 16
          })
        )
        const sql = yield* SqlClient.SqlClient
        const tables = yield* sql<{ table_name: string }>`
          SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'
        `
        for (const { table_name } of tables) {
          const rows = yield* sql.unsafe<{ found: boolean }>(
            `SELECT EXISTS (SELECT 1 FROM "${table_name}" t WHERE t::text LIKE $1) AS found`,
            [`%${marker}%`]
          )
          assert.isFalse(rows[0]!.found, `marker found in ${table_name}`)
        }
        // Even a failing request (whose error paths log) must not log the prompt.
        yield* Effect.promise(() =>
          openai.chat.completions
            .create({
              model: "chat-small",
              messages: [{ role: "user", content: `${marker} [[sim:error]]` }],
              max_tokens: 8
            })
            .catch(() => undefined)
        )
        assert.isAbove(logLines.length, 0)
        assert.isFalse(logLines.some((line) => line.includes(marker)))
      })
    )
  })
})
