import { assert, describe, layer } from "@effect/vitest"
import { createPermit2ApprovalTx } from "@x402/evm/upto/client"
import { Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import {
  createWalletClient,
  type Hash,
  type Hex,
  http,
  type LocalAccount,
  parseAbi,
  parseGwei,
  parseSignature,
  publicActions,
  toHex
} from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { Chain, signTransferAuthorization } from "../../src/chain/Chain.ts"
import { PERMIT2_ADDRESS } from "../../src/chain/Permit2.ts"
import { nonceBitmapPosition, signUptoPermit, type UptoPermitFields } from "../../src/chain/UptoPermit.ts"
import { Authorizations, type ClaimedAuthorization } from "../../src/ledger/Authorizations.ts"
import { Ledger, uptoNonceKey } from "../../src/ledger/Ledger.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { Settlement } from "../../src/payment/Settlement.ts"
import { nodeCall, submit } from "../support/ChainSend.ts"
import { TestDatabase } from "../support/Database.ts"
import { signedTransfer } from "../support/Pay.ts"

/**
 * D533: a spent nonce is not a payment. The token marks an EIP-3009 nonce used when the payer cancels it or
 * uses it for another transfer, and Permit2 marks a nonce spent when its owner invalidates it; the router
 * records revenue only on evidence of the transfer to its treasury. Real Postgres, real Anvil, real
 * treasury; the ledger's receipt calls are recorded, not made.
 */

const finalized: Array<string> = []
const LedgerCalls = Layer.succeed(Ledger, {
  signLater: () => Effect.void,
  finalizeReceipt: (requestId: string, facts: { readonly settlement: string }) =>
    Effect.sync(() => {
      finalized.push(`${requestId} ${facts.settlement}`)
    })
} as unknown as Ledger["Service"])

const TestLayer = Layer.mergeAll(TestDatabase, Chain.layer)

const sleep = (ms: number) => Effect.promise(() => new Promise((resolve) => setTimeout(resolve, ms)))

const settlementOnce = Effect.gen(function* () {
  const settlement = yield* Settlement.make.pipe(
    Effect.provide(Layer.mergeAll(Authorizations.layer, Layer.effect(Treasury, Treasury.make()), LedgerCalls))
  )
  return yield* settlement.runOnce
})

const walletOf = (chain: typeof Chain.Service, account: LocalAccount) =>
  createWalletClient({ account, chain: chain.publicClient.chain, transport: http(chain.rpcUrl) }).extend(
    publicActions
  )

/** A captured `exact` authorization, due for settlement: what the paid path leaves behind it. */
const queued = (requestId: string, walletIndex: number, value = 20_000n) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const sql = yield* SqlClient.SqlClient
    const account = privateKeyToAccount(chain.demoWallets[walletIndex]!.privateKey!)
    const { authorization, signature } = yield* signedTransfer(account, value)
    const payer = account.address.toLowerCase()
    yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                     provider_id, authorized, charged, status)
               VALUES (${requestId}, 'openai', 'x402', ${payer}, 'auto', 'chat-small', 'p', ${value.toString()}, 100, 'captured')`
    yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before, signature,
                                                status, attempts)
               VALUES (${payer}, ${authorization.nonce}, ${requestId}, ${value.toString()}, 0,
                       ${authorization.validBefore.toString()}, ${signature}, 'pending', 0)`
    return { account, authorization, signature }
  })

/** The payer's own `cancelAuthorization` of `nonce`, signed and sent by the payer (who pays its gas). */
const cancel = (account: LocalAccount, nonce: Hex, fees: { readonly tip?: bigint } = {}) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const signature = yield* Effect.promise(() =>
      account.signTypedData({
        domain: { ...chain.tokenDomain, chainId: chain.chainId, verifyingContract: chain.token },
        types: {
          CancelAuthorization: [
            { name: "authorizer", type: "address" },
            { name: "nonce", type: "bytes32" }
          ]
        },
        primaryType: "CancelAuthorization",
        message: { authorizer: account.address, nonce }
      })
    )
    const { v, r, s } = parseSignature(signature)
    return yield* Effect.promise(() =>
      walletOf(chain, account).writeContract({
        address: chain.token,
        abi: parseAbi([
          "function cancelAuthorization(address authorizer, bytes32 nonce, uint8 v, bytes32 r, bytes32 s)"
        ]),
        functionName: "cancelAuthorization",
        args: [account.address, nonce, Number(v), r, s],
        ...(fees.tip === undefined
          ? {}
          : { maxPriorityFeePerGas: fees.tip, maxFeePerGas: fees.tip + parseGwei("100") })
      })
    )
  })

const rowOf = (requestId: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ status: string; last_error: string | null; tx_hash: string | null }>`
      SELECT status, last_error, tx_hash FROM x402_authorizations WHERE request_id = ${requestId}`.pipe(
      Effect.map((rows) => rows[0]!),
      Effect.orDie
    )
  )

const settledEntries = (requestId: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ n: number }>`SELECT count(*)::int AS n FROM ledger_entries
                       WHERE request_id = ${requestId} AND kind = 'settled'`.pipe(
      Effect.map((rows) => rows[0]!.n),
      Effect.orDie
    )
  )

/** Unpaid for good: failed, no settlement in the ledger, the receipt told so, and no money moved. */
const expectUnpaid = (
  requestId: string,
  reason: string,
  before: ReadonlyArray<bigint>,
  balances: Effect.Effect<ReadonlyArray<bigint>, unknown, Chain>
) =>
  Effect.gen(function* () {
    const row = yield* rowOf(requestId)
    assert.strictEqual(row.status, "failed", `${requestId}: ${row.last_error}`)
    assert.include(row.last_error ?? "", reason)
    assert.strictEqual(yield* settledEntries(requestId), 0)
    assert.include(finalized, `${requestId} failed`)
    assert.deepStrictEqual(yield* Effect.orDie(balances), before)
  })

describe("settlement takes a spent nonce as paid only on evidence of the transfer (D533)", () => {
  layer(TestLayer, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a payer who cancels its authorization before settlement has not paid", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { account, authorization } = yield* queued("req_cancelled", 0)
        const hash = yield* cancel(account, authorization.nonce)
        assert.strictEqual(
          (yield* Effect.promise(() => chain.publicClient.waitForTransactionReceipt({ hash }))).status,
          "success"
        )
        assert.isTrue(
          yield* chain.authorizationState(account.address, authorization.nonce),
          "the nonce is spent"
        )
        const balances = Effect.all([chain.balanceOf(account.address), chain.balanceOf(chain.treasury)])
        const before = yield* Effect.orDie(balances)
        yield* settlementOnce
        yield* expectUnpaid("req_cancelled", "cancelled", before, balances)
      })
    )

    it.effect(
      "a cancel mined ahead of our transfer in its block: ours reverts, and the answer is unpaid",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          // The payer's first payment settles: its class's gas estimate now plans the next (D530), so the
          // next transfer's only check before signing is a call at `latest` (D532), which a pooled cancel passes.
          yield* queued("req_raced_first", 1, 1_000n)
          yield* settlementOnce
          assert.strictEqual((yield* rowOf("req_raced_first")).status, "landed")
          const { account, authorization } = yield* queued("req_raced", 1)
          const balances = Effect.all([chain.balanceOf(account.address), chain.balanceOf(chain.treasury)])
          const before = yield* Effect.orDie(balances)
          yield* nodeCall(chain, "evm_setAutomine", [false])
          yield* Effect.gen(function* () {
            // The cancel waits in the pool with the higher tip: the block takes it first.
            yield* cancel(account, authorization.nonce, { tip: parseGwei("50") })
            const pass = yield* Effect.forkChild(settlementOnce)
            for (let i = 0; i < 300; i++) {
              if ((yield* rowOf("req_raced")).tx_hash !== null) break
              yield* sleep(50)
            }
            const ours = (yield* rowOf("req_raced")).tx_hash as Hash | null
            assert.isNotNull(ours, "our transfer was sent: the pooled cancel is not in the latest block")
            yield* nodeCall(chain, "evm_mine")
            yield* Fiber.join(pass)
            const receipt = yield* Effect.promise(() =>
              chain.publicClient.getTransactionReceipt({ hash: ours as Hash })
            )
            assert.strictEqual(receipt.status, "reverted")
          }).pipe(Effect.ensuring(nodeCall(chain, "evm_setAutomine", [true])))
          // The payer's wallet paid the cancel's gas in ETH; its token balance and the treasury's are unchanged.
          yield* expectUnpaid("req_raced", "cancelled", before, balances)
        })
    )

    it.effect("a nonce the payer used to pay someone else has not paid us", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { account, authorization } = yield* queued("req_elsewhere", 2)
        // The same nonce, signed again to another address, and sent first.
        const elsewhere = { ...authorization, to: chain.demoWallets[7]!.address, value: 20_000n }
        const signature = yield* Effect.promise(() =>
          signTransferAuthorization(account, {
            token: chain.token,
            chainId: chain.chainId,
            domain: chain.tokenDomain,
            ...elsewhere
          })
        )
        const hash = yield* Effect.orDie(submit(chain, { ...elsewhere, signature }))
        assert.strictEqual((yield* Effect.orDie(chain.waitForReceipt(hash))).status, "success")
        const balances = Effect.all([chain.balanceOf(account.address), chain.balanceOf(chain.treasury)])
        const before = yield* Effect.orDie(balances)
        yield* settlementOnce
        yield* expectUnpaid(
          "req_elsewhere",
          "not this authorization's 20000 to the treasury",
          before,
          balances
        )
      })
    )

    it.effect("our authorization sent by someone else is paid, and lands with that transaction's hash", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { authorization, signature } = yield* queued("req_sent_by_another", 3)
        const hash = yield* Effect.orDie(submit(chain, { ...authorization, signature }))
        assert.strictEqual((yield* Effect.orDie(chain.waitForReceipt(hash))).status, "success")
        yield* settlementOnce
        const row = yield* rowOf("req_sent_by_another")
        assert.deepStrictEqual([row.status, row.tx_hash], ["landed", hash])
        assert.strictEqual(yield* settledEntries("req_sent_by_another"), 1)
      })
    )

    it.effect("an upto permit whose Permit2 nonce the payer invalidated has not paid", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const sql = yield* SqlClient.SqlClient
        const account = privateKeyToAccount(chain.demoWallets[4]!.privateKey!)
        const wallet = walletOf(chain, account)
        const approval = yield* Effect.promise(() =>
          wallet.sendTransaction(createPermit2ApprovalTx(chain.token))
        )
        yield* Effect.promise(() => wallet.waitForTransactionReceipt({ hash: approval }))
        const now = BigInt(Math.floor(Date.now() / 1000))
        const fields: UptoPermitFields = {
          from: account.address,
          permitted: { token: chain.token, amount: 150_000n },
          spender: chain.uptoProxy,
          nonce: BigInt(toHex(crypto.getRandomValues(new Uint8Array(32)))),
          deadline: now + 3600n,
          witness: { to: chain.treasury, facilitator: chain.routerSigner, validAfter: 0n }
        }
        const signature = yield* Effect.promise(() => signUptoPermit(account, chain.chainId, fields))
        const payer = account.address.toLowerCase()
        yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                         provider_id, authorized, charged, status)
                   VALUES ('req_upto_invalidated', 'openai', 'x402', ${payer}, 'auto', 'chat-small', 'p', 150000, 1000, 'captured')`
        yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before, signature,
                                                    status, attempts, scheme, ceiling)
                   VALUES (${payer}, ${uptoNonceKey(fields.nonce)}, 'req_upto_invalidated', 1000, 0,
                           ${fields.deadline.toString()}, ${signature}, 'pending', 0, 'upto', 150000)`
        const { wordPos, bitPos } = nonceBitmapPosition(fields.nonce)
        const invalidated = yield* Effect.promise(() =>
          wallet.writeContract({
            address: PERMIT2_ADDRESS,
            abi: parseAbi(["function invalidateUnorderedNonces(uint256 wordPos, uint256 mask)"]),
            functionName: "invalidateUnorderedNonces",
            args: [wordPos, 1n << bitPos]
          })
        )
        yield* Effect.promise(() => wallet.waitForTransactionReceipt({ hash: invalidated }))
        assert.isTrue(yield* chain.permit2NonceUsed(account.address, fields.nonce))
        const balances = Effect.all([chain.balanceOf(account.address), chain.balanceOf(chain.treasury)])
        const before = yield* Effect.orDie(balances)
        yield* settlementOnce
        yield* expectUnpaid("req_upto_invalidated", "Permit2 nonce", before, balances)
      })
    )

    it.effect("a claim that lost its row writes nothing to it: the claim is its attempt", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const authorizations = yield* Authorizations
        yield* queued("req_two_claims", 6)
        const mine = (rows: ReadonlyArray<ClaimedAuthorization>) =>
          rows.find((row) => row.request_id === "req_two_claims")!
        const first = mine(yield* authorizations.claimDue)
        // The first claim goes stale (3 minutes), the row goes back to the queue and is claimed again.
        yield* sql`UPDATE x402_authorizations SET updated_at = now() - interval '4 minutes'
                   WHERE request_id = 'req_two_claims'`
        yield* authorizations.recover
        const second = mine(yield* authorizations.claimDue)
        assert.strictEqual(second.attempts, first.attempts + 1)
        assert.isFalse(yield* authorizations.recordFailed(first, "late", { final: true }))
        yield* authorizations.recordBroadcast([{ row: first, hash: `0x${"99".repeat(32)}` }])
        const row = yield* rowOf("req_two_claims")
        assert.deepStrictEqual([row.status, row.tx_hash], ["submitted", null])
        // The live claim's failure is written (failed for good here, so no later pass settles it).
        assert.isTrue(yield* authorizations.recordFailed(second, "unpaid", { final: true }))
        assert.strictEqual((yield* rowOf("req_two_claims")).status, "failed")
      }).pipe(Effect.provide(Authorizations.layer))
    )

    // Last: it moves the chain's clock 2,500 s ahead of ours.
    it.effect("the token's events are read forward a page at a time: a cancel 2,500 blocks on is found", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        const { account, authorization } = yield* queued("req_cancelled_later", 5)
        // 2,500 blocks a second apart after the reservation (more than two pages of the look), then the cancel.
        // Mined 250 at a time: one call for all 2,500 can outlast the client's 10 s timeout on a loaded machine.
        for (let i = 0; i < 10; i++) yield* nodeCall(chain, "anvil_mine", [toHex(250), toHex(1)])
        const hash = yield* cancel(account, authorization.nonce)
        yield* Effect.promise(() => chain.publicClient.waitForTransactionReceipt({ hash }))
        const balances = Effect.all([chain.balanceOf(account.address), chain.balanceOf(chain.treasury)])
        const before = yield* Effect.orDie(balances)
        yield* settlementOnce
        yield* expectUnpaid("req_cancelled_later", "cancelled", before, balances)
      })
    )
  })
})
