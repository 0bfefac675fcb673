import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import OpenAI from "openai"
import { type Address, createWalletClient, type Hex, http } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { testUsdcAbi } from "../../src/chain/artifacts.ts"
import { Chain } from "../../src/chain/Chain.ts"
import type { EconomicsRecord } from "../../src/domain/Economics.ts"
import { FOLD_LOCK } from "../../src/ledger/CreditFold.ts"
import { holdInTransaction } from "../support/Locks.ts"
import { payer, waitFor, waitForBook } from "../support/Pay.ts"
import { call, RouterUrl } from "../support/Router.ts"

export interface Inclusion {
  readonly epoch_id: number
  readonly leaf: Hex
  readonly proof: ReadonlyArray<Hex>
  readonly root: Hex
  readonly anchor_tx: Hex
  readonly anchor_contract: Address
  readonly chain_id: number
}

export interface ReceiptReply {
  readonly receipt: {
    readonly request_id: string
    readonly wallet: string
    readonly charged: number
    readonly authorized: number
    readonly payment_ref: string
    readonly refund_ref: string | null
    readonly settlement: string
    readonly epoch_id: number
  }
  readonly final: boolean
  readonly signature: Hex | null
  readonly signer: Address
  readonly typed_data: unknown
  readonly inclusion: Inclusion | null
}

export { waitFor, waitForBook }

/** The fold's lock held by the test (no pass can run) until the returned effect lets it go. */
export const holdFolds = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  holdInTransaction(sql`SELECT pg_advisory_xact_lock(${FOLD_LOCK})`)
)

/** An economics row for requests seeded straight into the ledger, where economics is not what is tested. */
export const seededEconomics = (requestId: string): EconomicsRecord => ({
  request_id: requestId,
  reaped: true
})

export const getReceipt = (id: string) =>
  Effect.map(call(`/v1/receipts/${id}`), (r) => (r.status === 200 ? (r.json as ReceiptReply) : undefined))

export const receiptWhere = (id: string, predicate: (r: ReceiptReply) => boolean, timeoutMs = 30_000) =>
  waitFor(
    `receipt ${id}`,
    Effect.map(getReceipt(id), (r) => (r !== undefined && predicate(r) ? r : undefined)),
    timeoutMs
  )

/** The official openai SDK paying with x402 from demo wallet `index`, as any client would. */
export const paidClient = (index: number) =>
  Effect.gen(function* () {
    const base = yield* RouterUrl
    const { account, payingFetch } = yield* payer(index)
    const openai = new OpenAI({ apiKey: "x402", baseURL: `${base}/v1`, fetch: payingFetch, maxRetries: 0 })
    return { account, openai }
  })

/** One paid, non-streaming completion; returns its request id. */
export const paidCompletion = (index: number, content: string) =>
  Effect.gen(function* () {
    const { openai } = yield* paidClient(index)
    const { response } = yield* Effect.promise(() =>
      openai.chat.completions
        .create({ model: "chat-medium", messages: [{ role: "user", content }], max_tokens: 48 })
        .withResponse()
    )
    return response.headers.get("x-request-id")!
  })

/** A demo wallet sends the treasury what payouts and withdrawals will need (seeded settlements are not real). */
export const fundTreasury = (amount: bigint) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const wallet = createWalletClient({
      account: privateKeyToAccount(chain.demoWallets[7]!.privateKey!),
      chain: chain.publicClient.chain,
      transport: http(chain.rpcUrl)
    })
    const hash = yield* Effect.promise(() =>
      wallet.writeContract({
        address: chain.token,
        abi: testUsdcAbi,
        functionName: "transfer",
        args: [chain.treasury, amount]
      })
    )
    yield* chain.waitForReceipt(hash)
  }).pipe(Effect.orDie)
