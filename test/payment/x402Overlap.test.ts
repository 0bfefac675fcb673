import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { type Address, createWalletClient, http } from "viem"
import { generatePrivateKey, type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts"
import { Chain, type ChainShape } from "../../src/chain/Chain.ts"
import { randomAuthorizationNonce } from "../../src/chain/Eip3009.ts"
import { paymentSignatureHeader } from "../../src/domain/X402.ts"
import { Ledger, OVERCOMMITTED } from "../../src/ledger/Ledger.ts"
import {
  handSignedHeader,
  payer,
  providerRequests,
  signedTransfer,
  waitFor,
  waitForBook
} from "../support/Pay.ts"
import { postJson, routerWithFleet } from "../support/Router.ts"

/**
 * An x402 call of a payer the chain showed funded within the minute reserves while the chain's reads (the
 * nonce's state, the payer's balance) travel, and the chain's verdict is taken before anything is served
 * (D543). A payment the chain then refuses, or one beyond what the payer's unsettled authorizations leave
 * of the balance, is a 402 and its reservation is withdrawn whole: no request, authorization, ledger row,
 * lease or outstanding sum is left, and no provider is called. A payer not seen funded waits for the chain
 * before anything is written.
 */

/** The balance reads of one payer wait for the test's word, after the node answered them. */
const held = {
  payer: undefined as Address | undefined,
  gate: undefined as Deferred.Deferred<void> | undefined
}
const holdingBalances = (chain: ChainShape): ChainShape => ({
  ...chain,
  balanceOf: (address) =>
    Effect.tap(chain.balanceOf(address), () =>
      held.gate !== undefined && held.payer?.toLowerCase() === address.toLowerCase()
        ? Deferred.await(held.gate)
        : Effect.void
    )
})

/** Holds `who`'s balance reads while `test` runs, and lets them go however it ends. */
const holdingFor = <A, E, R>(who: Address, test: (gate: Deferred.Deferred<void>) => Effect.Effect<A, E, R>) =>
  Effect.flatMap(Deferred.make<void>(), (gate) => {
    held.payer = who
    held.gate = gate
    return Effect.ensuring(
      test(gate),
      Effect.andThen(
        Effect.sync(() => {
          held.gate = undefined
        }),
        Deferred.succeed(gate, undefined)
      )
    )
  })

const body = { model: "chat-medium", messages: [{ role: "user", content: "hello" }], max_tokens: 32 }

/** What an x402 call leaves of its payer in the book. */
const traces = (who: Address) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const payer_ = who.toLowerCase()
    const [row] = yield* sql<{
      requests: number
      authorizations: number
      entries: number
      leases: number
      outstanding: string | null
    }>`
      SELECT (SELECT count(*)::int FROM requests WHERE payer = ${payer_}) AS requests,
             (SELECT count(*)::int FROM x402_authorizations WHERE payer = ${payer_}) AS authorizations,
             (SELECT count(*)::int FROM ledger_entries WHERE account = ${payer_}) AS entries,
             (SELECT count(*)::int FROM capacity_leases) AS leases,
             (SELECT outstanding::text FROM x402_outstanding WHERE payer = ${payer_}) AS outstanding
    `
    return row!
  }).pipe(Effect.orDie)

const reserved = (who: Address) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ request_id: string }>`
      SELECT request_id FROM requests WHERE payer = ${who.toLowerCase()} AND status = 'reserved'`
    return rows.length > 0 ? rows[0]!.request_id : undefined
  }).pipe(Effect.orDie)

/** Every lease of the calls before has ended (their captures run after their replies). */
const noLeases = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [row] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM capacity_leases`
  return row!.n === 0 ? true : undefined
}).pipe(Effect.orDie)

/**
 * A payment header whose authorization the payer itself already sent to the token (it pays the gas): the
 * chain says its nonce is used. The call it is sent with is refused, with no money moved by the router.
 */
const spentHeader = (account: PrivateKeyAccount, value: bigint) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const { authorization, signature } = yield* signedTransfer(account, value)
    const call = chain.calls.transferWithAuthorization({ ...authorization, signature })
    const wallet = createWalletClient({
      account,
      chain: chain.publicClient.chain,
      transport: http(chain.rpcUrl)
    })
    const hash = yield* Effect.promise(() => wallet.sendTransaction({ to: call.to, data: call.data }))
    const receipt = yield* Effect.promise(() => chain.publicClient.waitForTransactionReceipt({ hash }))
    assert.strictEqual(receipt.status, "success")
    assert.isTrue(yield* chain.authorizationState(account.address, authorization.nonce))
    return paymentSignatureHeader({
      x402Version: 2,
      scheme: "exact",
      network: chain.network,
      payload: { authorization, signature }
    })
  })

type Reply = { readonly status: number; readonly text: string; readonly json: unknown }

const assertRefused = (reply: Reply, error: string) => {
  assert.strictEqual(reply.status, 402, reply.text.slice(0, 300))
  const answer = reply.json as { code?: string; error?: string; accepts?: ReadonlyArray<unknown> }
  assert.strictEqual(answer.code, "payment_invalid")
  assert.strictEqual(answer.error, error)
  assert.isAbove(answer.accepts?.length ?? 0, 0, "fresh accepts to sign again")
}

const pay = (header: string) => postJson("/v1/chat/completions", body, { "payment-signature": header })

describe("an x402 call reserves while the chain's reads travel (D543)", () => {
  layer(routerWithFleet({}, undefined, holdingBalances), { excludeTestServices: true, timeout: 180_000 })(
    (it) => {
      it.effect(
        "a payer the chain showed funded is reserved before the chain answers, and nothing is served until it has",
        () =>
          Effect.gen(function* () {
            yield* waitForBook
            const { account } = yield* payer(4)
            // Its first call waits for the chain, which shows it funded.
            const first = yield* pay(yield* handSignedHeader(account, { value: 500_000n }))
            assert.strictEqual(first.status, 200, first.text.slice(0, 300))
            yield* waitFor(
              "the first call's capture",
              Effect.map(reserved(account.address), (id) => (id === undefined ? true : undefined))
            )
            yield* holdingFor(account.address, (gate) =>
              Effect.gen(function* () {
                const providersBefore = yield* providerRequests
                const call = yield* pay(yield* handSignedHeader(account, { value: 5_000_000n })).pipe(
                  Effect.forkChild
                )
                // The payer's balance is read and held back: the request is reserved all the same...
                const requestId = yield* waitFor("the reservation", reserved(account.address))
                // ...and no provider is called while the chain's verdict is out.
                yield* Effect.sleep("300 millis")
                assert.strictEqual(
                  yield* providerRequests,
                  providersBefore,
                  "no provider work before the verdict"
                )
                assert.isUndefined(call.pollUnsafe(), "the call waits for the chain")
                yield* Deferred.succeed(gate, undefined)
                const reply = yield* Fiber.join(call)
                assert.strictEqual(reply.status, 200, reply.text.slice(0, 300))
                assert.strictEqual(reply.headers.get("x-request-id"), requestId)
                assert.strictEqual((yield* providerRequests) - providersBefore, 1)
              })
            )
          })
      )

      it.effect(
        "a payer not seen funded writes nothing until the chain answers, and nothing when refused",
        () =>
          Effect.gen(function* () {
            yield* waitForBook
            const chain = yield* Chain
            const pauper = privateKeyToAccount(generatePrivateKey())
            assert.strictEqual(yield* chain.balanceOf(pauper.address), 0n)
            const none = { requests: 0, authorizations: 0, entries: 0, leases: 0, outstanding: null }
            yield* waitFor("the leases of earlier calls to end", noLeases)
            const providersBefore = yield* providerRequests
            yield* holdingFor(pauper.address, (gate) =>
              Effect.gen(function* () {
                const call = yield* pay(yield* handSignedHeader(pauper, { value: 5_000_000n })).pipe(
                  Effect.forkChild
                )
                // Its balance is read and held back: nothing is reserved meanwhile.
                yield* Effect.sleep("500 millis")
                assert.isUndefined(call.pollUnsafe(), "the call waits for the chain")
                assert.deepStrictEqual(yield* traces(pauper.address), none)
                yield* Deferred.succeed(gate, undefined)
                assertRefused(yield* Fiber.join(call), "insufficient balance")
              })
            )
            assert.deepStrictEqual(yield* traces(pauper.address), none)
            assert.strictEqual(yield* providerRequests, providersBefore)
          })
      )

      it.effect(
        "a payment the chain refuses after its reservation is refused, and the reservation is withdrawn whole",
        () =>
          Effect.gen(function* () {
            yield* waitForBook
            const { account } = yield* payer(6)
            // Seen funded: its first call is refused by the chain (the nonce was spent), after the read.
            assertRefused(yield* pay(yield* spentHeader(account, 1_000_000n)), "authorization already used")
            yield* waitFor("the leases of earlier calls to end", noLeases)
            const before = yield* traces(account.address)
            const providersBefore = yield* providerRequests
            const spent = yield* spentHeader(account, 2_000_000n)
            yield* holdingFor(account.address, (gate) =>
              Effect.gen(function* () {
                const call = yield* pay(spent).pipe(Effect.forkChild)
                // Reserved while the read is held: the withdrawal below has something to take back.
                yield* waitFor("the reservation", reserved(account.address))
                assert.deepStrictEqual(yield* traces(account.address), {
                  requests: before.requests + 1,
                  authorizations: before.authorizations + 1,
                  entries: before.entries + 1,
                  leases: 1,
                  outstanding: "2000000"
                })
                yield* Deferred.succeed(gate, undefined)
                assertRefused(yield* Fiber.join(call), "authorization already used")
              })
            )
            assert.deepStrictEqual(yield* traces(account.address), { ...before, outstanding: "0" })
            assert.strictEqual(yield* providerRequests, providersBefore)

            // The same spent header twice at once: one is reserved and withdrawn, the other refused by the
            // nonce's key while (or after) the first holds it; the withdrawal takes the payer's row first,
            // as the reservation does, so neither waits on the other in a cycle.
            const twice = yield* spentHeader(account, 3_000_000n)
            const replies = yield* Effect.all([pay(twice), pay(twice)], { concurrency: 2 })
            for (const reply of replies) assertRefused(reply, "authorization already used")
            assert.deepStrictEqual(yield* traces(account.address), { ...before, outstanding: "0" })
            assert.strictEqual(yield* providerRequests, providersBefore)
          })
      )

      it.effect(
        "an authorization beyond what the payer's unsettled ones leave of the balance is refused and withdrawn",
        () =>
          Effect.gen(function* () {
            yield* waitForBook
            const chain = yield* Chain
            const ledger = yield* Ledger
            const { account } = yield* payer(5)
            // Seen funded, with nothing of its own outstanding: a call the chain refuses.
            assertRefused(yield* pay(yield* spentHeader(account, 1_000_000n)), "authorization already used")
            yield* waitFor("the leases of earlier calls to end", noLeases)
            const balance = yield* chain.balanceOf(account.address)
            // An earlier authorization of this payer, reserved and not settled, holds all but 1 USDC.
            const earlier = balance - 1_000_000n
            yield* ledger.reserveX402(
              {
                requestId: `req_earlier_${randomAuthorizationNonce().slice(2, 14)}`,
                dialect: "openai",
                payer: account.address,
                requestedModel: "chat-medium",
                modelClass: "chat-medium",
                providerId: "earlier",
                authorized: Number(earlier),
                agent: {}
              },
              {
                nonce: randomAuthorizationNonce(),
                validAfter: 0n,
                validBefore: 9_999_999_999n,
                signature: "0x01",
                balance
              }
            )
            const before = yield* traces(account.address)
            assert.strictEqual(before.outstanding, earlier.toString())
            const providersBefore = yield* providerRequests
            // 5 USDC: the chain finds the balance enough for it alone; with the earlier one it is not.
            assertRefused(yield* pay(yield* handSignedHeader(account, { value: 5_000_000n })), OVERCOMMITTED)
            assert.deepStrictEqual(yield* traces(account.address), before)
            assert.strictEqual(yield* providerRequests, providersBefore)
            // Within what is left, the payer is served.
            const reply = yield* pay(yield* handSignedHeader(account, { value: 500_000n }))
            assert.strictEqual(reply.status, 200, reply.text.slice(0, 300))
          })
      )
    }
  )
})
