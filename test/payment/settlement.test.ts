import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Fiber, Metric, Result } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import type { Hash } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { type AuthorizationFate, Chain, ChainError, type TransactionState } from "../../src/chain/Chain.ts"
import { Authorizations } from "../../src/ledger/Authorizations.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { type Confirmed, Treasury } from "../../src/ledger/Treasury.ts"
import { Settlement, x402Held, x402Unpaid } from "../../src/payment/Settlement.ts"
import { submit } from "../support/ChainSend.ts"
import { signedTransfer } from "../support/Pay.ts"
import { routerLayer } from "../support/Router.ts"

describe("settlement", () => {
  layer(routerLayer(), { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect(
      "an authorization that already landed (a lost receipt wait) is recorded as landed, not failed",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const sql = yield* SqlClient.SqlClient
          const account = privateKeyToAccount(chain.demoWallets[3]!.privateKey!)
          const { authorization, signature } = yield* signedTransfer(account, 20_000n)
          // The first attempt's transfer landed, but the wait for its receipt failed: the row went back
          // to `pending` without a hash. A second submission would fail at gas estimation.
          const hash = yield* submit(chain, { ...authorization, signature })
          assert.strictEqual((yield* chain.waitForReceipt(hash)).status, "success")
          const payer = account.address.toLowerCase()
          yield* sql`INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                         provider_id, authorized, charged, status)
                   VALUES ('req_lost_wait', 'openai', 'x402', ${payer}, 'auto', 'chat-small', 'p', 20000, 100, 'captured')`
          yield* sql`INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before, signature,
                                                    status, attempts)
                   VALUES (${payer}, ${authorization.nonce}, 'req_lost_wait', 20000, 0,
                           ${authorization.validBefore.toString()}, ${signature}, 'pending', 1)`
          // This pass or the router's own loop (which may claim the row first) settles it.
          const settlement = yield* Settlement
          yield* settlement.runOnce
          const row = sql<{ status: string; signature: string | null; tx_hash: string | null }>`
          SELECT status, signature, tx_hash FROM x402_authorizations WHERE request_id = 'req_lost_wait'`
          for (let i = 0; i < 100 && (yield* row)[0]!.status !== "landed"; i++)
            yield* Effect.sleep("100 millis")
          // Landed with the transaction that moved the money (D533), not a hash of ours.
          assert.deepStrictEqual((yield* row)[0], { status: "landed", signature: null, tx_hash: hash })
          const settled = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM ledger_entries WHERE request_id = 'req_lost_wait' AND kind = 'settled'`
          assert.strictEqual(settled[0]!.n, 1)
          // A late second landing (a claim that no longer holds the row) writes nothing: the landing is one
          // statement whose ledger row exists only when the authorization's own update matched (D333).
          const authorizations = yield* Authorizations
          const again = yield* authorizations.recordLanded([
            {
              row: {
                payer,
                nonce: authorization.nonce,
                request_id: "req_lost_wait",
                value: "20000",
                valid_after: "0",
                valid_before: authorization.validBefore.toString(),
                signature,
                tx_hash: hash,
                attempts: 1,
                scheme: "exact",
                ceiling: null,
                reserved_at: "0"
              },
              hash
            }
          ])
          assert.deepStrictEqual(again, { requestIds: [], receipts: [] })
          const still = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM ledger_entries WHERE request_id = 'req_lost_wait' AND kind = 'settled'`
          assert.strictEqual(still[0]!.n, 1)
        })
    )
  })
})

describe("settlement's look for stale claims", () => {
  it.effect("runs on the first pass and then every 30 s, not on every 250 ms pass", () =>
    Effect.gen(function* () {
      let recovered = 0
      const unused = Effect.die("not reached: no authorization is due")
      const settlement = yield* Settlement.make.pipe(
        Effect.provideService(
          Authorizations,
          Authorizations.of({
            recover: Effect.sync(() => {
              recovered++
            }),
            claimDue: Effect.succeed([]),
            releaseClaimsOf: () => unused,
            recordBroadcast: () => unused,
            recordLanded: () => unused,
            recordFailed: () => unused
          })
        ),
        // Only a claimed authorization reaches the chain, the ledger or the treasury.
        Effect.provideService(Chain, {} as Chain["Service"]),
        Effect.provideService(Ledger, {} as Ledger["Service"]),
        Effect.provideService(Treasury, {} as Treasury["Service"])
      )
      yield* settlement.runOnce
      yield* settlement.runOnce
      assert.strictEqual(recovered, 1)
      yield* TestClock.adjust("29 seconds")
      yield* settlement.runOnce
      assert.strictEqual(recovered, 1)
      yield* TestClock.adjust("1 second")
      yield* settlement.runOnce
      assert.strictEqual(recovered, 2)
    })
  )
})

describe("a settlement pass", () => {
  it.effect("sends every claimed authorization before it waits for any (D451)", () =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const rows = Array.from({ length: 9 }, (_, i) => ({
        payer: "0x00000000000000000000000000000000000000a1",
        nonce: `0x${i.toString(16).padStart(64, "0")}`,
        request_id: `req_pass_${i}`,
        value: "20000",
        valid_after: "0",
        valid_before: "99999999999",
        signature: `0x${"11".repeat(65)}`,
        tx_hash: null,
        attempts: 1,
        scheme: "exact" as const,
        ceiling: null,
        reserved_at: "0"
      }))
      const hashOf = (requestId: string) =>
        `0x${Number(requestId.slice("req_pass_".length)).toString(16).padStart(64, "0")}` as const
      const settlement = yield* Settlement.make.pipe(
        Effect.provideService(
          Authorizations,
          Authorizations.of({
            recover: Effect.void,
            claimDue: Effect.succeed(rows),
            releaseClaimsOf: () => Effect.succeed(0),
            recordBroadcast: () => Effect.void,
            recordLanded: (landings) =>
              Effect.sync(() => {
                for (const { row } of landings) events.push(`landed ${row.request_id}`)
                return { requestIds: landings.map(({ row }) => row.request_id), receipts: [] }
              }),
            recordFailed: (row) => Effect.die(`not expected: ${row.request_id} failed`)
          })
        ),
        Effect.provideService(Chain, {
          treasury: "0x00000000000000000000000000000000000000b2"
        } as unknown as Chain["Service"]),
        Effect.provideService(Ledger, { signLater: () => Effect.void } as unknown as Ledger["Service"]),
        Effect.provideService(
          Treasury,
          Treasury.of({
            send: () => Effect.die("not expected: a pass sends its rows together"),
            sendMany: (transfers) =>
              Effect.sync(() =>
                transfers.map((transfer) => {
                  const requestId = transfer._tag === "X402Settlement" ? transfer.requestId : "?"
                  events.push(`send ${requestId}`)
                  return Result.succeed(hashOf(requestId))
                })
              ),
            confirm: () => Effect.die("not expected: a pass confirms its hashes together"),
            confirmMany: (hashes) =>
              Effect.sync(() =>
                hashes.map((hash) => {
                  events.push(`confirm ${hash}`)
                  return Result.succeed({ status: "success", blockNumber: 1n } as const)
                })
              ),
            recorded: () => Effect.succeed(undefined),
            attempts: () => Effect.succeed([]),
            recover: Effect.succeed(0)
          })
        )
      )
      assert.strictEqual(yield* settlement.runOnce, rows.length)
      const firstConfirm = events.findIndex((event) => event.startsWith("confirm"))
      const lastSend = events.findLastIndex((event) => event.startsWith("send"))
      assert.isTrue(firstConfirm > lastSend, events.join(", "))
      assert.strictEqual(events.filter((event) => event.startsWith("landed")).length, rows.length)
    })
  )
})

describe("what a settlement decides when its wait fails or no transfer of ours moved the money (D515, D533)", () => {
  const treasury = "0x00000000000000000000000000000000000000b2"
  const ours = `0x${"ab".repeat(32)}` as const
  const earlier = `0x${"cd".repeat(32)}` as const
  const theirs = `0x${"ef".repeat(32)}` as const
  const chainDown = new ChainError({ reason: "Rpc", message: "chain down" })

  interface Case {
    readonly scheme?: "exact" | "upto"
    /** What the wait for our transfer said, on each pass in turn (one pass per answer). */
    readonly confirmed: Confirmed | ReadonlyArray<Confirmed>
    /** Our live transfer for the purpose, and every transfer ever recorded for it. */
    readonly recorded?: Hash
    readonly attempts?: ReadonlyArray<Hash>
    /** The state of each of our transactions (unlisted: pending). */
    readonly states?: Record<string, TransactionState>
    readonly spent: Effect.Effect<boolean, ChainError>
    readonly fate?: Effect.Effect<AuthorizationFate | undefined, ChainError>
    /** Whether this claim still holds the row when it fails it. */
    readonly holdsClaim?: boolean
    /** Our clock, the row's `validBefore` and the chain's time, in seconds (default: 0, 0, 10: expired). */
    readonly clock?: number
    readonly validBefore?: number
    readonly chainTime?: bigint
  }

  /** Passes over one claimed row, past its `validBefore`: what they recorded, in order. */
  const decide = (c: Case) =>
    Effect.gen(function* () {
      const events: Array<string> = []
      const answers = Array.isArray(c.confirmed) ? c.confirmed : [c.confirmed as Confirmed]
      let pass = 0
      yield* TestClock.setTime((c.clock ?? 0) * 1000)
      const row = {
        payer: "0x00000000000000000000000000000000000000a1",
        nonce: c.scheme === "upto" ? `permit2:0x${"07".repeat(32)}` : `0x${"07".repeat(32)}`,
        request_id: "req_decided",
        value: "20000",
        valid_after: "0",
        valid_before: String(c.validBefore ?? 0),
        signature: `0x${"11".repeat(65)}`,
        tx_hash: null,
        attempts: 1,
        scheme: c.scheme ?? ("exact" as const),
        ceiling: c.scheme === "upto" ? "150000" : null,
        reserved_at: "0"
      }
      const settlement = yield* Settlement.make.pipe(
        Effect.provideService(
          Authorizations,
          Authorizations.of({
            recover: Effect.void,
            claimDue: Effect.succeed([row]),
            releaseClaimsOf: () => Effect.succeed(0),
            recordBroadcast: () => Effect.void,
            recordLanded: (landings) =>
              Effect.sync(() => {
                for (const landing of landings) events.push(`landed ${landing.hash}`)
                return { requestIds: landings.map(({ row }) => row.request_id), receipts: [] }
              }),
            recordFailed: (_row, _reason, { final }) =>
              Effect.sync(() => {
                events.push(final ? "failed" : "held")
                return c.holdsClaim ?? true
              })
          })
        ),
        Effect.provideService(Chain, {
          treasury,
          outgoing: {
            state: (hash: Hash) => Effect.succeed(c.states?.[hash] ?? { _tag: "Pending" })
          },
          headTimestamp: () => Effect.succeed(c.chainTime ?? 10n),
          authorizationState: () => c.spent,
          permit2NonceUsed: () => c.spent,
          authorizationFate: () => c.fate ?? Effect.die("not expected: the token's events are read")
        } as unknown as Chain["Service"]),
        Effect.provideService(Ledger, {
          signLater: () => Effect.void,
          finalizeReceipt: () =>
            Effect.sync(() => {
              events.push("receipt failed")
            })
        } as unknown as Ledger["Service"]),
        Effect.provideService(
          Treasury,
          Treasury.of({
            send: () => Effect.die("not expected"),
            sendMany: (transfers) => Effect.succeed(transfers.map(() => Result.succeed(ours))),
            confirm: () => Effect.die("not expected"),
            confirmMany: (hashes) => Effect.succeed(hashes.map(() => answers[pass]!)),
            recorded: () => Effect.succeed(c.recorded),
            attempts: () => Effect.succeed(c.attempts ?? []),
            recover: Effect.succeed(0)
          })
        )
      )
      for (; pass < answers.length; pass++) yield* settlement.runOnce
      return events
    })

  const mined = (status: "success" | "reverted"): TransactionState => ({
    _tag: "Mined",
    status,
    blockNumber: 2n
  })

  it.effect(
    "a wait that failed while our transfer is still open holds the row, and the next pass lands it",
    () =>
      Effect.gen(function* () {
        // The node's answers are lost too: our transaction's state, and the token's record of the nonce.
        const events = yield* decide({
          confirmed: [Result.fail(chainDown), Result.succeed({ status: "success", blockNumber: 2n })],
          recorded: ours,
          attempts: [ours],
          states: {},
          spent: Effect.fail(chainDown)
        })
        assert.deepStrictEqual(events, ["held", `landed ${ours}`])
      })
  )

  it.effect("an upto wait that failed while our transfer was mined successfully lands with ours", () =>
    Effect.gen(function* () {
      const events = yield* decide({
        scheme: "upto",
        confirmed: Result.fail(chainDown),
        recorded: ours,
        states: { [ours]: mined("success") },
        spent: Effect.succeed(true)
      })
      assert.deepStrictEqual(events, [`landed ${ours}`])
    })
  )

  it.effect("a transfer of ours whose record says replaced, but which is mined successfully, pays", () =>
    Effect.gen(function* () {
      for (const scheme of ["exact", "upto"] as const) {
        const events = yield* decide({
          scheme,
          confirmed: Result.succeed({ status: "replaced" }),
          attempts: [earlier, ours],
          states: { [earlier]: mined("success") },
          spent: Effect.succeed(true)
        })
        assert.deepStrictEqual(events, [`landed ${earlier}`], scheme)
      }
    })
  )

  it.effect("an upto nonce spent with no transfer of ours mined is unpaid for good", () =>
    Effect.gen(function* () {
      const events = yield* decide({
        scheme: "upto",
        confirmed: Result.succeed({ status: "reverted", blockNumber: 2n }),
        attempts: [ours],
        states: { [ours]: mined("reverted") },
        spent: Effect.succeed(true)
      })
      assert.deepStrictEqual(events, ["failed", "receipt failed"])
    })
  )

  it.effect("a spent nonce whose cause is not read is held, never failed, even past validBefore", () =>
    Effect.gen(function* () {
      const heldBefore = (yield* Metric.value(x402Held)).count
      const unpaidBefore = (yield* Metric.value(x402Unpaid)).count
      const reverted = Result.succeed({ status: "reverted", blockNumber: 2n } as const)
      // The nonce's state unread, the token's events unread, or no event found yet.
      for (const c of [
        { confirmed: reverted, spent: Effect.fail(chainDown) },
        { confirmed: reverted, spent: Effect.succeed(true), fate: Effect.fail(chainDown) },
        { confirmed: reverted, spent: Effect.succeed(true), fate: Effect.succeed(undefined) },
        { confirmed: Result.fail(chainDown), spent: Effect.succeed(true), fate: Effect.succeed(undefined) }
      ] satisfies ReadonlyArray<Case>) {
        assert.deepStrictEqual(yield* decide(c), ["held"])
      }
      assert.strictEqual(
        (yield* Metric.value(x402Held)).count - heldBefore,
        4,
        "svc_x402_settlements_held_total"
      )
      // Unspent past validBefore: failed, as before.
      assert.deepStrictEqual(yield* decide({ confirmed: reverted, spent: Effect.succeed(false) }), [
        "failed",
        "receipt failed"
      ])
      assert.strictEqual((yield* Metric.value(x402Unpaid)).count - unpaidBefore, 1, "svc_x402_unpaid_total")
    })
  )

  it.effect("an unspent nonce past validBefore by our clock but not the chain's is retried, not failed", () =>
    Effect.gen(function* () {
      const reverted = Result.succeed({ status: "reverted", blockNumber: 2n } as const)
      const unspent = { confirmed: reverted, spent: Effect.succeed(false), clock: 100, validBefore: 50 }
      assert.deepStrictEqual(yield* decide({ ...unspent, chainTime: 49n }), ["held"])
      assert.deepStrictEqual(yield* decide({ ...unspent, chainTime: 50n }), ["failed", "receipt failed"])
      // Not yet past by our clock: a failure, retried.
      assert.deepStrictEqual(yield* decide({ ...unspent, clock: 10 }), ["held"])
    })
  )

  it.effect("a spent upto nonce while a transfer of ours is still pooled is held", () =>
    Effect.gen(function* () {
      const events = yield* decide({
        scheme: "upto",
        confirmed: Result.succeed({ status: "replaced" }),
        attempts: [earlier, ours],
        states: { [earlier]: mined("reverted"), [ours]: { _tag: "Pending" } },
        spent: Effect.succeed(true)
      })
      assert.deepStrictEqual(events, ["held"])
    })
  )

  it.effect("a look at the token's events that takes over 60 s is held, and writes nothing else", () =>
    Effect.gen(function* () {
      const look = yield* Effect.forkChild(
        decide({
          confirmed: Result.succeed({ status: "reverted", blockNumber: 2n }),
          spent: Effect.succeed(true),
          fate: Effect.never
        })
      )
      // The pass runs up to the look (it sets the clock as it starts), then the clock passes the bound.
      for (let i = 0; i < 7; i++) {
        for (let j = 0; j < 10; j++) yield* Effect.yieldNow
        yield* TestClock.adjust("10 seconds")
      }
      assert.deepStrictEqual(yield* Fiber.join(look), ["held"])
    })
  )

  it.effect(
    "the token's events decide an exact nonce: only its transfer of this value to the treasury pays",
    () =>
      Effect.gen(function* () {
        const reverted = Result.succeed({ status: "reverted", blockNumber: 2n } as const)
        const decideBy = (fate: AuthorizationFate) =>
          decide({ confirmed: reverted, spent: Effect.succeed(true), fate: Effect.succeed(fate) })
        assert.deepStrictEqual(
          yield* decideBy({ _tag: "Transferred", txHash: theirs, to: treasury, value: 20_000n }),
          [`landed ${theirs}`]
        )
        for (const fate of [
          { _tag: "Transferred", txHash: theirs, to: treasury, value: 19_999n },
          {
            _tag: "Transferred",
            txHash: theirs,
            to: "0x00000000000000000000000000000000000000c3",
            value: 20_000n
          },
          { _tag: "Canceled", txHash: theirs },
          { _tag: "UsedOtherwise", txHash: theirs }
        ] satisfies ReadonlyArray<AuthorizationFate>) {
          assert.deepStrictEqual(yield* decideBy(fate), ["failed", "receipt failed"], fate._tag)
        }
      })
  )

  it.effect("a claim that lost its row to another pass leaves the receipt alone", () =>
    Effect.gen(function* () {
      const events = yield* decide({
        confirmed: Result.succeed({ status: "reverted", blockNumber: 2n }),
        spent: Effect.succeed(true),
        fate: Effect.succeed({ _tag: "Canceled", txHash: theirs }),
        holdsClaim: false
      })
      assert.deepStrictEqual(events, ["failed"])
    })
  )
})
