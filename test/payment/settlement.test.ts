import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Result } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { privateKeyToAccount } from "viem/accounts"
import { Chain, ChainError } from "../../src/chain/Chain.ts"
import { Authorizations } from "../../src/ledger/Authorizations.ts"
import { Ledger } from "../../src/ledger/Ledger.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { Settlement } from "../../src/payment/Settlement.ts"
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
          const settlement = yield* Settlement
          yield* settlement.runOnce
          const rows = yield* sql<{ status: string; signature: string | null }>`
          SELECT status, signature FROM x402_authorizations WHERE request_id = 'req_lost_wait'`
          assert.deepStrictEqual(rows[0], { status: "landed", signature: null })
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
                ceiling: null
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
        ceiling: null
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

describe("a settlement whose wait fails while our transfer is still open", () => {
  it.effect(
    "leaves the row for the next pass, even past validBefore, and the next pass lands it (D515)",
    () =>
      Effect.gen(function* () {
        const row = {
          payer: "0x00000000000000000000000000000000000000a1",
          nonce: `0x${"07".repeat(32)}`,
          request_id: "req_open",
          value: "20000",
          valid_after: "0",
          // Already past (the test clock reads 0): a row failed now is failed for good, with a failed receipt.
          valid_before: "0",
          signature: `0x${"11".repeat(65)}`,
          tx_hash: null,
          attempts: 1,
          scheme: "exact" as const,
          ceiling: null
        }
        const hash = `0x${"ab".repeat(32)}` as const
        const events: Array<string> = []
        let pass = 0
        const settlement = yield* Settlement.make.pipe(
          Effect.provideService(
            Authorizations,
            Authorizations.of({
              recover: Effect.void,
              claimDue: Effect.sync(() => {
                pass++
                return [row]
              }),
              releaseClaimsOf: () => Effect.succeed(0),
              recordBroadcast: () => Effect.void,
              recordLanded: (landings) =>
                Effect.sync(() => {
                  for (const landing of landings)
                    events.push(`landed ${landing.row.request_id} ${landing.hash}`)
                  return { requestIds: landings.map(({ row }) => row.request_id), receipts: [] }
                }),
              recordFailed: (failedRow, _reason, expired) =>
                Effect.sync(() => {
                  events.push(`${expired ? "failed" : "retry"} ${failedRow.request_id}`)
                })
            })
          ),
          Effect.provideService(Chain, {
            treasury: "0x00000000000000000000000000000000000000b2",
            // The token's answer is lost too (the RPC error that failed the wait).
            authorizationState: () => Effect.fail(new ChainError({ reason: "Rpc", message: "chain down" }))
          } as unknown as Chain["Service"]),
          Effect.provideService(Ledger, {
            signLater: () => Effect.void,
            finalizeReceipt: (requestId: string) =>
              Effect.sync(() => {
                events.push(`receipt failed ${requestId}`)
              })
          } as unknown as Ledger["Service"]),
          Effect.provideService(
            Treasury,
            Treasury.of({
              send: () => Effect.die("not expected"),
              // The purpose's live transaction, adopted by every pass.
              sendMany: (transfers) => Effect.succeed(transfers.map(() => Result.succeed(hash))),
              confirm: () => Effect.die("not expected"),
              confirmMany: (hashes) =>
                Effect.succeed(
                  hashes.map(() =>
                    pass === 1
                      ? Result.fail(new ChainError({ reason: "Rpc", message: "gap fill failed" }))
                      : Result.succeed({ status: "success", blockNumber: 2n } as const)
                  )
                ),
              recorded: () => Effect.succeed(hash),
              recover: Effect.succeed(0)
            })
          )
        )
        yield* settlement.runOnce
        assert.deepStrictEqual(events, ["retry req_open"])
        yield* settlement.runOnce
        assert.deepStrictEqual(events, ["retry req_open", `landed req_open ${hash}`])
      })
  )
})
