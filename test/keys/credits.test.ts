import { randomBytes } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { type Hex, toHex } from "viem"
import type { PrivateKeyAccount } from "viem/accounts"
import { withdrawalDomain, withdrawalTypes } from "../../src/domain/Credits.ts"
import { Reconciliation } from "../../src/ledger/Reconciliation.ts"
import { payer, waitFor } from "../support/Pay.ts"
import { call, postJson, RouterUrl, routerLayer } from "../support/Router.ts"
import { type BalanceView, balanceWith, createKey, errorCode, invite } from "./support.ts"

const depositJson = (payingFetch: typeof fetch, base: string, amountUsdc: string) =>
  Effect.promise(async () => {
    const response = await payingFetch(`${base}/v1/credits/deposits`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ amount_usdc: amountUsdc })
    })
    return { status: response.status, json: (await response.json()) as Record<string, unknown> }
  })

const balanceOf = (key: string) =>
  Effect.map(balanceWith(key), (reply) => {
    if (reply.status !== 200) throw new Error(`balance: ${reply.status} ${reply.text}`)
    return reply.json as BalanceView
  })

interface Intent {
  readonly wallet: Hex
  readonly to: Hex
  readonly amount: bigint
  readonly nonce: Hex
  readonly deadline: bigint
}

const signWithdrawal = (signer: PrivateKeyAccount, chainId: number, intent: Intent) =>
  Effect.promise(() =>
    signer.signTypedData({
      domain: withdrawalDomain(chainId),
      types: withdrawalTypes,
      primaryType: "CreditWithdrawal",
      message: intent
    })
  )

const wire = (intent: Intent, signature: Hex) => ({
  wallet: intent.wallet,
  to: intent.to,
  amount: intent.amount.toString(),
  nonce: intent.nonce,
  deadline: Number(intent.deadline),
  signature
})

/** An invited wallet with a credit key, funded by a landed deposit of `amountUsdc`. */
const fundedWallet = (index: number, amountUsdc: string) =>
  Effect.gen(function* () {
    const { chain, account, payingFetch } = yield* payer(index)
    const base = yield* RouterUrl
    yield* invite(account.address)
    const key = yield* createKey(account, { label: `w${index}`, budget_usdc: "10", spend: true })
    const deposit = yield* depositJson(payingFetch, base, amountUsdc)
    assert.strictEqual(deposit.status, 202, JSON.stringify(deposit.json))
    yield* waitFor(
      "the deposit to land",
      Effect.map(balanceOf(key.key), (b) => (b.pending === 0 && b.available > 0 ? b : undefined))
    )
    return { chain, account, key }
  })

describe("prepaid credits", () => {
  layer(routerLayer(), { timeout: 120_000, excludeTestServices: true })((it) => {
    it.effect("a deposit without payment is a 402 quoting exactly the amount", () =>
      Effect.gen(function* () {
        const reply = yield* postJson("/v1/credits/deposits", { amount_usdc: "2.5" })
        assert.strictEqual(reply.status, 402, reply.text)
        const body = reply.json as { accepts: ReadonlyArray<{ amount: string; maxAmountRequired: string }> }
        assert.strictEqual(body.accepts[0]!.amount, "2500000")
        assert.strictEqual(body.accepts[0]!.maxAmountRequired, "2500000")
        const header = JSON.parse(
          Buffer.from(reply.headers.get("payment-required")!, "base64").toString("utf8")
        ) as { accepts: ReadonlyArray<{ amount: string }> }
        assert.strictEqual(header.accepts[0]!.amount, "2500000")
        const tooSmall = yield* postJson("/v1/credits/deposits", { amount_usdc: "0.001" })
        assert.strictEqual(tooSmall.status, 400)
        assert.strictEqual(errorCode(tooSmall.json), "deposit_below_minimum")
        const junk = yield* postJson("/v1/credits/deposits", { amount_usdc: "1.0000001" })
        assert.strictEqual(junk.status, 400)
      })
    )

    it.effect("an invited wallet's paid deposit is pending, then credited once its transfer lands", () =>
      Effect.gen(function* () {
        const { chain, account, payingFetch } = yield* payer(1)
        const sql = yield* SqlClient.SqlClient
        const base = yield* RouterUrl
        yield* invite(account.address)
        const key = yield* createKey(account, { label: "depositor", budget_usdc: "5", spend: true })
        const before = yield* chain.balanceOf(account.address)

        const deposit = yield* depositJson(payingFetch, base, "1.75")
        assert.strictEqual(deposit.status, 202, JSON.stringify(deposit.json))
        assert.deepInclude(deposit.json, {
          object: "credit_deposit",
          status: "pending",
          amount: 1_750_000,
          wallet: account.address.toLowerCase()
        })

        const credited = yield* waitFor(
          "the deposit to be credited",
          Effect.map(balanceOf(key.key), (b) => (b.available === 1_750_000 ? b : undefined))
        )
        assert.strictEqual(credited.pending, 0)
        assert.strictEqual(credited.available_usdc, "1.750000")
        const after = yield* chain.balanceOf(account.address)
        assert.strictEqual(before - after, 1_750_000n, "the payer paid exactly the deposit")

        const depositId = deposit.json.deposit_id as string
        const [row] = yield* sql<{
          status: string
        }>`SELECT status FROM deposits WHERE deposit_id = ${depositId}`
        assert.strictEqual(row?.status, "credited")
        const entries = yield* sql<{ kind: string; amount: string }>`
          SELECT kind, amount::text AS amount FROM ledger_entries WHERE request_id = ${depositId} ORDER BY id`
        assert.deepStrictEqual(
          entries.map((e) => [e.kind, e.amount]),
          [
            ["authorization_reserved", "1750000"],
            ["deposit_pending", "1750000"],
            ["settled", "1750000"],
            ["deposit_credited", "1750000"]
          ]
        )
        // Credited exactly once, however long we look.
        yield* Effect.sleep("600 millis")
        assert.strictEqual((yield* balanceOf(key.key)).available, 1_750_000)
      })
    )

    it.effect("a payer who is not invited gets 403 and no money moves", () =>
      Effect.gen(function* () {
        const { chain, account, payingFetch } = yield* payer(2)
        const sql = yield* SqlClient.SqlClient
        const base = yield* RouterUrl
        const before = yield* chain.balanceOf(account.address)
        const reply = yield* depositJson(payingFetch, base, "1")
        assert.strictEqual(reply.status, 403)
        assert.strictEqual((reply.json as { error: { code: string } }).error.code, "wallet_not_invited")
        yield* Effect.sleep("1 second")
        assert.strictEqual(yield* chain.balanceOf(account.address), before)
        const held = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM x402_authorizations WHERE payer = ${account.address.toLowerCase()}`
        assert.strictEqual(held[0]!.n, 0)
        const deposits = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM deposits WHERE wallet = ${account.address.toLowerCase()}`
        assert.strictEqual(deposits[0]!.n, 0)
      })
    )

    it.effect(
      "a signed withdrawal debits the balance and pays out on chain; replays and overdrafts refused",
      () =>
        Effect.gen(function* () {
          const { chain, account, key } = yield* fundedWallet(3, "3")
          const sql = yield* SqlClient.SqlClient
          const nowS = BigInt(Math.floor(Date.now() / 1000))
          const intent: Intent = {
            wallet: account.address,
            to: account.address,
            amount: 1_200_000n,
            nonce: toHex(randomBytes(32)),
            deadline: nowS + 600n
          }
          const signature = yield* signWithdrawal(account, chain.chainId, intent)
          const onChainBefore = yield* chain.balanceOf(account.address)

          const accepted = yield* postJson("/v1/credits/withdrawals", wire(intent, signature))
          assert.strictEqual(accepted.status, 202, accepted.text)
          const withdrawal = accepted.json as { withdrawal_id: string; status: string; amount: number }
          assert.strictEqual(withdrawal.status, "pending")
          assert.strictEqual(withdrawal.amount, 1_200_000)
          assert.strictEqual((yield* balanceOf(key.key)).available, 1_800_000, "debited at once")

          const paid = yield* waitFor(
            "the payout",
            Effect.map(call(`/v1/credits/withdrawals/${withdrawal.withdrawal_id}`), (r) => {
              const view = r.json as { status: string; tx_hash: string | null }
              return view.status === "paid" ? view : undefined
            })
          )
          assert.match(paid.tx_hash!, /^0x[0-9a-f]{64}$/)
          assert.strictEqual((yield* chain.balanceOf(account.address)) - onChainBefore, 1_200_000n)
          const [tx] = yield* sql<{ status: string }>`
          SELECT status FROM withdrawals WHERE withdrawal_id = ${withdrawal.withdrawal_id}`
          assert.strictEqual(tx?.status, "paid")

          // The same signed intent again: 409, nothing debited.
          const replay = yield* postJson("/v1/credits/withdrawals", wire(intent, signature))
          assert.strictEqual(replay.status, 409)
          assert.strictEqual(errorCode(replay.json), "idempotency_replay")
          assert.include(replay.text, withdrawal.withdrawal_id)

          // More than the balance: 400, nothing debited.
          const big: Intent = { ...intent, amount: 1_800_001n, nonce: toHex(randomBytes(32)) }
          const over = yield* postJson(
            "/v1/credits/withdrawals",
            wire(big, yield* signWithdrawal(account, chain.chainId, big))
          )
          assert.strictEqual(over.status, 400, over.text)
          assert.strictEqual(errorCode(over.json), "insufficient_balance")

          // Signed by someone else, or over other fields, or expired: refused.
          const { account: stranger } = yield* payer(4)
          const forged: Intent = { ...intent, amount: 100_000n, nonce: toHex(randomBytes(32)) }
          const byStranger = yield* postJson(
            "/v1/credits/withdrawals",
            wire(forged, yield* signWithdrawal(stranger, chain.chainId, forged))
          )
          assert.strictEqual(byStranger.status, 401)
          assert.strictEqual(errorCode(byStranger.json), "invalid_withdrawal_signature")
          const redirected = yield* postJson("/v1/credits/withdrawals", {
            ...wire(forged, yield* signWithdrawal(account, chain.chainId, forged)),
            to: stranger.address
          })
          assert.strictEqual(redirected.status, 401)
          const stale: Intent = { ...forged, nonce: toHex(randomBytes(32)), deadline: nowS - 1n }
          const expired = yield* postJson(
            "/v1/credits/withdrawals",
            wire(stale, yield* signWithdrawal(account, chain.chainId, stale))
          )
          assert.strictEqual(expired.status, 400)
          assert.strictEqual(errorCode(expired.json), "withdrawal_expired")

          assert.strictEqual(
            (yield* balanceOf(key.key)).available,
            1_800_000,
            "only the first withdrawal moved"
          )
          const notFound = yield* call("/v1/credits/withdrawals/wd_nope")
          assert.strictEqual(notFound.status, 404)
        })
    )

    it.effect("after deposits and withdrawals the ledger still reconciles with the chain", () =>
      Effect.gen(function* () {
        const reconciliation = yield* Reconciliation
        const result = yield* reconciliation.runOnce
        assert.deepStrictEqual(result.discrepancies, [])
        assert.strictEqual(result.status, "ok")
      })
    )
  })
})
