import { randomBytes, randomInt } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Cause, ConfigProvider, Context, Deferred, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { Chain, ChainError } from "../../src/chain/Chain.ts"
import { feeSplit } from "../../src/domain/Billing.ts"
import { type ReceiptBody, receiptTypedData } from "../../src/domain/Receipt.ts"
import { type CaptureRecord, Ledger } from "../../src/ledger/Ledger.ts"
import { tracingWith } from "../../src/Telemetry.ts"
import { TestDatabase } from "../support/Database.ts"
import { fundedKey } from "../support/Keys.ts"
import { holdFolds, seededEconomics } from "./support.ts"

/**
 * Group commit of settlements (D370): the key and `exact` x402 settlements of one wallet ready in the same
 * turn go to Postgres as one statement, each request claimed on its own. Statements are counted as the
 * router's SQL spans; what each request wrote is read back row by row.
 */
const exporter = new InMemorySpanExporter()
const Database = Layer.mergeAll(TestDatabase, Chain.layer)
const LedgerLayer = Ledger.layer.pipe(
  Layer.provideMerge(Database),
  // Merged: the statements run in the tests' own fibers (and fibers forked from them) are traced too.
  Layer.provideMerge(tracingWith([new SimpleSpanProcessor(exporter)]))
)

const AUTHORIZED = 10_000
const CHARGED = 7_000

/** Settling statements sent since the last reset: the batched one (over a record set) and the others. */
const statements = () => {
  const texts = exporter
    .getFinishedSpans()
    .map((span) => String(span.attributes["db.query.text"] ?? ""))
    .filter((text) => /UPDATE requests/.test(text))
  return {
    batched: texts.filter((text) => /FROM settling s/.test(text)).length,
    alone: texts.filter((text) => !/FROM settling s/.test(text)).length
  }
}

type Paid = "credit" | "x402"

interface Reserved {
  readonly requestId: string
  readonly paid: Paid
  readonly lease: string
  readonly settle: (charged: number) => CaptureRecord
}

/** A request of `wallet` reserved by the ledger (a key's or an `exact` authorization's), holding a capacity lease. */
const reserve = (
  key: { keyId: string; wallet: string },
  paid: Paid,
  chosen: { readonly requestId?: string; readonly providerId?: string } = {}
) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    const sql = yield* SqlClient.SqlClient
    const requestId = chosen.requestId ?? `req_${randomBytes(8).toString("hex")}`
    const record = {
      requestId,
      dialect: "openai",
      payer: key.wallet,
      requestedModel: "auto",
      modelClass: "chat-small",
      providerId: chosen.providerId ?? `p${randomInt(3)}`,
      authorized: AUTHORIZED,
      agent: {}
    }
    if (paid === "credit") yield* ledger.reserveCredit(record, key.keyId)
    else {
      yield* ledger.reserveX402(record, {
        nonce: `0x${randomBytes(32).toString("hex")}`,
        validAfter: 0n,
        validBefore: 9_999_999_999n,
        signature: `0x${"11".repeat(65)}`
      })
    }
    const lease = `lease_${requestId}`
    yield* sql`INSERT INTO capacity_leases (lease_id, provider_id, model_class, expires_at)
               VALUES (${lease}, 'p1', 'chat-small', now() + interval '1 minute')`
    const settle = (charged: number): CaptureRecord => {
      const receipt: ReceiptBody = {
        request_id: requestId,
        wallet: key.wallet,
        provider_id: record.providerId,
        model_class: "chat-small",
        in_tokens: 100,
        out_tokens: charged === 0 ? 0 : 20,
        cached_tokens: 0,
        price_in: 100_000,
        price_out: 400_000,
        price_in_cached: null,
        charged,
        authorized: AUTHORIZED,
        payment_ref: paid === "credit" ? `credit:${key.keyId}` : "",
        refund_ref: null,
        ttft_ms: 10,
        status: charged === 0 ? "released" : "ok",
        settlement: charged === 0 ? "none" : paid === "credit" ? "landed" : "pending",
        // Each settlement's own epoch: the request must take its own row's (D509).
        epoch_id: epochFor(charged),
        session_id: null,
        quotes_competing: 1,
        created_at: Date.now()
      }
      return {
        receipt,
        economics: seededEconomics(requestId),
        source: paid === "credit" ? { _tag: "Credit", keyId: key.keyId } : { _tag: "X402" },
        lease
      }
    }
    return { requestId, paid, lease, settle } satisfies Reserved
  }).pipe(Effect.orDie)

/** The epoch of a settlement at `charged`: distinct per charge, so a batch's rows each carry their own. */
const epochFor = (charged: number) => 1_000 + charged

/** Captures at `charged` (released whole at 0). */
const settle = (request: Reserved, charged: number) =>
  Effect.gen(function* () {
    const ledger = yield* Ledger
    return yield* charged === 0 ? ledger.release(request.settle(0)) : ledger.capture(request.settle(charged))
  })

/** Everything one request's settlement wrote, as rows. */
const written = (requestId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [request] = yield* sql<{ status: string; charged: string | null; epoch: number | null }>`
      SELECT q.status, q.charged::text, q.epoch_id::int AS epoch FROM requests q WHERE q.request_id = ${requestId}`
    const entries = yield* sql<{ account: string; kind: string; amount: string }>`
      SELECT account, kind, amount::text FROM ledger_entries WHERE request_id = ${requestId} ORDER BY kind, account`
    const counts = yield* sql<{ receipts: number; economics: number; leases: number }>`
      SELECT (SELECT count(*)::int FROM receipts WHERE request_id = ${requestId}) AS receipts,
             (SELECT count(*)::int FROM economics WHERE request_id = ${requestId}) AS economics,
             (SELECT count(*)::int FROM capacity_leases WHERE lease_id = ${`lease_${requestId}`}) AS leases`
    const queued = yield* sql<{ charged: string }>`
      SELECT charged::text FROM credit_unfolded WHERE request_id = ${requestId}`
    const authorization = yield* sql<{ status: string; signed: boolean }>`
      SELECT status, signature IS NOT NULL AS signed FROM x402_authorizations WHERE request_id = ${requestId}`
    const refund = yield* sql<{
      amount: string
    }>`SELECT amount::text FROM refunds WHERE request_id = ${requestId}`
    const receipt = yield* storedReceipt(requestId)
    return {
      status: request!.status,
      charged: request!.charged === null ? null : Number(request!.charged),
      epoch: request!.epoch,
      entries: entries.map((e) => `${e.kind} ${e.account} ${e.amount}`),
      ...counts[0]!,
      queued: queued.map((q) => Number(q.charged)),
      authorization: authorization.map((a) => `${a.status}${a.signed ? " signed" : ""}`),
      refunds: refund.map((r) => Number(r.amount)),
      receipt
    }
  }).pipe(Effect.orDie)

/**
 * How the receipt was stored: "signed once" (by the router signer over the stored body, final, and inserted so
 * by the settling statement itself: the row's version is the one that statement wrote with the economics, D495),
 * "signed by an update", or "unsigned".
 */
const storedReceipt = (requestId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const chain = yield* Chain
    const [row] = yield* sql<{ body: ReceiptBody; signature: string | null; final: boolean; once: boolean }>`
      SELECT r.body, r.signature, r.final, r.xmin = e.xmin AS once
      FROM receipts r JOIN economics e USING (request_id) WHERE r.request_id = ${requestId}`
    if (row === undefined) return "missing"
    if (row.signature === null) return row.final ? "unsigned, final" : "unsigned"
    const expected = yield* chain.signTypedData(receiptTypedData(row.body, chain.chainId))
    if (row.signature !== expected || !row.final) return "signed wrong"
    return row.once ? "signed once" : "signed by an update"
  }).pipe(Effect.orDie)

/** What settling `request` at `charged` must write, by the rules of `Capture.ts`. */
const expected = (request: Reserved, wallet: string, providerId: string, charged: number) => {
  const { routerFee, providerShare } = feeSplit(charged)
  const captured = charged > 0
  const entries = captured
    ? [
        `capture ${wallet} ${charged}`,
        `provider_share provider:${providerId} ${providerShare}`,
        `router_fee router ${routerFee}`
      ]
    : []
  // The reservation's own row, then the settlement's.
  if (request.paid === "credit") {
    entries.push(
      `credit_reserved ${wallet} ${AUTHORIZED}`,
      `credit_released ${wallet} ${AUTHORIZED - charged}`
    )
  } else {
    entries.push(`authorization_reserved ${wallet} ${AUTHORIZED}`)
    if (captured) entries.push(`refund_due ${wallet} ${AUTHORIZED - charged}`)
    else entries.push(`authorization_released ${wallet} ${AUTHORIZED}`)
  }
  return {
    status: captured ? "captured" : "released",
    charged,
    // The receipt's epoch, which the payouts pass reads on the request (D509).
    epoch: epochFor(charged),
    entries: entries.sort(),
    receipts: 1,
    economics: 1,
    leases: 0,
    queued: request.paid === "credit" ? [charged] : [],
    authorization: request.paid === "credit" ? [] : [captured ? "pending signed" : "released"],
    refunds: request.paid === "x402" && captured ? [AUTHORIZED - charged] : [],
    // Final as settled (a key's charge, a release): stored signed; an x402 capture waits for its transfer.
    receipt: request.paid === "x402" && captured ? "unsigned" : "signed once"
  }
}

const providerOf = (request: Reserved) => request.settle(0).receipt.provider_id

/** The points of the providers these tests settle for (`p0`..`p2`), summed over their shards. */
const providerPoints = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{
    provider_id: string
    settled: string
    pending: string
    receipts: string
    ok: string
  }>`
    SELECT provider_id, sum(settled_charged)::text AS settled, sum(pending_charged)::text AS pending,
           sum(receipts)::text AS receipts, sum(receipts_ok)::text AS ok
    FROM points_providers WHERE provider_id IN ('p0', 'p1', 'p2') GROUP BY provider_id`
  return new Map(
    rows.map((r) => [
      r.provider_id,
      {
        settled: Number(r.settled),
        pending: Number(r.pending),
        receipts: Number(r.receipts),
        ok: Number(r.ok)
      }
    ])
  )
}).pipe(Effect.orDie)

describe("settlements ready in the same turn are written in one statement", () => {
  layer(LedgerLayer, { excludeTestServices: true, timeout: 60_000 })((it) => {
    it.effect("N settlements of a wallet: one statement, each request claimed once with its own rows", () =>
      Effect.gen(function* () {
        // No fold pass takes the queued captures away while the test reads them.
        yield* holdFolds
        const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
        const paid: ReadonlyArray<Paid> = [
          "credit",
          "x402",
          "credit",
          "credit",
          "x402",
          "credit",
          "x402",
          "credit"
        ]
        const requests = yield* Effect.forEach(paid, (p) => reserve(key, p))
        // Captured at different charges; one of each kind released whole.
        const charges = requests.map((_, i) => (i === 3 || i === 4 ? 0 : CHARGED - 100 * i))
        const pointsBefore = yield* providerPoints
        exporter.reset()
        const claimed = yield* Effect.forEach(requests, (request, i) => settle(request, charges[i]!), {
          concurrency: "unbounded"
        })
        assert.deepStrictEqual(
          claimed,
          requests.map(() => true)
        )
        // The six captures together; each release alone (D420), by the same statement over its one row.
        assert.deepStrictEqual(statements(), { batched: 3, alone: 0 })
        for (const [i, request] of requests.entries()) {
          const rows = yield* written(request.requestId)
          assert.deepStrictEqual(
            { ...rows, entries: [...rows.entries].sort() },
            expected(request, key.wallet, providerOf(request), charges[i]!),
            `request ${i} (${request.paid})`
          )
        }

        // Their points, moved once per wallet and per provider shard by the statement (D546), as receipt by receipt.
        const expectedPoints = new Map<
          string,
          { settled: number; pending: number; receipts: number; ok: number }
        >()
        for (const [i, request] of requests.entries()) {
          const provider = providerOf(request)
          const was = expectedPoints.get(provider) ?? { settled: 0, pending: 0, receipts: 0, ok: 0 }
          const charged = charges[i]!
          expectedPoints.set(provider, {
            settled: was.settled + (charged > 0 && request.paid === "credit" ? charged : 0),
            pending: was.pending + (charged > 0 && request.paid === "x402" ? charged : 0),
            receipts: was.receipts + 1,
            ok: was.ok + (charged > 0 ? 1 : 0)
          })
        }
        const pointsAfter = yield* providerPoints
        for (const [provider, expected] of expectedPoints) {
          const before = pointsBefore.get(provider) ?? { settled: 0, pending: 0, receipts: 0, ok: 0 }
          const after = pointsAfter.get(provider)!
          assert.deepStrictEqual(
            {
              settled: after.settled - before.settled,
              pending: after.pending - before.pending,
              receipts: after.receipts - before.receipts,
              ok: after.ok - before.ok
            },
            expected,
            provider
          )
        }
        const sql = yield* SqlClient.SqlClient
        const [wallet] = yield* sql<{ settled: string; pending: string }>`
          SELECT settled_charged::text AS settled, pending_charged::text AS pending FROM points_wallets
          WHERE wallet = ${key.wallet}`
        assert.deepStrictEqual(
          { settled: Number(wallet!.settled), pending: Number(wallet!.pending) },
          {
            settled: [...expectedPoints.values()].reduce((sum, p) => sum + p.settled, 0),
            pending: [...expectedPoints.values()].reduce((sum, p) => sum + p.pending, 0)
          }
        )

        // Settled again, together: nothing claimed, nothing written twice; a lease the requests still named (taken
        // again here) is ended by the statement all the same, as it is whether or not the statement claims.
        for (const request of requests) {
          yield* sql`INSERT INTO capacity_leases (lease_id, provider_id, model_class, expires_at)
                     VALUES (${request.lease}, 'p1', 'chat-small', now() + interval '1 minute')`
        }
        exporter.reset()
        const again = yield* Effect.forEach(requests, (request) => settle(request, 1), {
          concurrency: "unbounded"
        })
        assert.deepStrictEqual(
          again,
          requests.map(() => false)
        )
        const [{ left }] = (yield* sql<{ left: number }>`
          SELECT count(*)::int AS left FROM capacity_leases WHERE lease_id IN ${sql.in(requests.map((r) => r.lease))}`) as [
          { left: number }
        ]
        assert.strictEqual(left, 0, "leases of a statement that claimed nothing")
        assert.deepStrictEqual(statements(), { batched: 1, alone: 0 })
        for (const [i, request] of requests.entries()) {
          const rows = yield* written(request.requestId)
          assert.deepStrictEqual(
            { ...rows, entries: [...rows.entries].sort() },
            expected(request, key.wallet, providerOf(request), charges[i]!)
          )
        }
      })
    )

    it.effect(
      "a batch holding a request settled before, and one settled twice in the turn, claims each once",
      () =>
        Effect.gen(function* () {
          // No fold pass takes the queued captures away while the test reads them.
          yield* holdFolds
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const [settledBefore, twice, plain] = yield* Effect.forEach(
            ["credit", "x402", "credit"] as const,
            (p) => reserve(key, p)
          )
          assert.isTrue(yield* settle(settledBefore!, CHARGED))
          exporter.reset()
          const claimed = yield* Effect.all(
            [settle(settledBefore!, 1), settle(twice!, CHARGED), settle(twice!, 0), settle(plain!, 500)],
            { concurrency: "unbounded" }
          )
          // The repeated request's second settlement waits for the batch and is then written alone.
          assert.deepStrictEqual(claimed, [false, true, false, true])
          assert.deepStrictEqual(statements(), { batched: 2, alone: 0 })
          assert.deepStrictEqual(
            yield* written(settledBefore!.requestId),
            expected(settledBefore!, key.wallet, providerOf(settledBefore!), CHARGED)
          )
          const rows = yield* written(twice!.requestId)
          assert.deepStrictEqual(
            { ...rows, entries: [...rows.entries].sort() },
            expected(twice!, key.wallet, providerOf(twice!), CHARGED)
          )
          const plainRows = yield* written(plain!.requestId)
          assert.deepStrictEqual(
            { ...plainRows, entries: [...plainRows.entries].sort() },
            expected(plain!, key.wallet, providerOf(plain!), 500)
          )
        })
    )

    it.effect(
      "a batch whose statement fails: each settlement is written alone, and only the bad one fails",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          // No fold pass takes the queued captures away while the test reads them.
          yield* holdFolds
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const requests = yield* Effect.forEach(["credit", "x402", "credit", "x402"] as const, (p) =>
            reserve(key, p)
          )
          const poisoned = requests[2]!
          // A receipt already there for a request still reserved: its insert fails, and with it the batch.
          yield* sql`INSERT INTO receipts (request_id, epoch_id, body)
                     VALUES (${poisoned.requestId}, 1, ${JSON.stringify(poisoned.settle(0).receipt)}::jsonb)`
          exporter.reset()
          const exits = yield* Effect.forEach(requests, (request) => Effect.exit(settle(request, CHARGED)), {
            concurrency: "unbounded"
          })
          // One batched statement, then each of its four alone (the batched statement over one row).
          assert.deepStrictEqual(statements(), { batched: 5, alone: 0 })
          for (const [i, request] of requests.entries()) {
            const exit = exits[i]!
            if (request === poisoned) {
              // As it failed alone before batching: a defect carrying the database's error.
              assert.isTrue(Exit.isFailure(exit) && Cause.hasDies(exit.cause), String(exit))
              assert.strictEqual((yield* written(request.requestId)).status, "reserved")
              continue
            }
            assert.isTrue(Exit.isSuccess(exit) && exit.value, String(exit))
            const rows = yield* written(request.requestId)
            assert.deepStrictEqual(
              { ...rows, entries: [...rows.entries].sort() },
              expected(request, key.wallet, providerOf(request), CHARGED)
            )
          }
        })
    )

    it.effect(
      "a release of a wallet comes after its batch waiting on a provider shard: no deadlock, no batch falls back",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const provider = `pdl${randomInt(1_000_000)}`
          // Request ids on chosen shards of one provider's points (`hashtext(request) & 7`).
          const candidates = Array.from({ length: 400 }, () => `req_${randomBytes(8).toString("hex")}`)
          const shards = yield* sql<{ id: string; shard: number }>`
            SELECT id, (hashtext(id) & 7)::int AS shard FROM unnest(${candidates}::text[]) AS id`
          const on = (shard: number, skip = 0) => shards.filter((r) => r.shard === shard)[skip]!.id
          const [y1, y2, x1, x2] = yield* Effect.forEach([on(1), on(3), on(3, 1), on(5)], (requestId) =>
            reserve(key, "credit", { requestId, providerId: provider })
          )
          // The shared rows exist already, as on a live router.
          yield* sql`INSERT INTO points_wallets (wallet) VALUES (${key.wallet}) ON CONFLICT DO NOTHING`
          yield* sql`INSERT INTO points_providers (provider_id, shard) VALUES (${provider}, 1), (${provider}, 3), (${provider}, 5)
                     ON CONFLICT DO NOTHING`
          // Another writer holds the provider's shard 1 for a moment.
          const held = yield* Deferred.make<number>()
          const letGo = yield* Deferred.make<void>()
          const holder = yield* Effect.forkChild(
            sql.withTransaction(
              Effect.gen(function* () {
                const [me] = yield* sql<{ pid: number }>`
                  SELECT pg_backend_pid() AS pid FROM points_providers
                  WHERE provider_id = ${provider} AND shard = 1 FOR UPDATE`
                yield* Deferred.succeed(held, me!.pid)
                yield* Deferred.await(letGo)
              })
            )
          )
          const holderPid = yield* Deferred.await(held)
          exporter.reset()
          // Batch Y: captures on shards 1 and 3 lock the wallet's row, then wait for shard 1.
          const y = yield* Effect.forkChild(
            Effect.all([settle(y1!, CHARGED), settle(y2!, CHARGED)], { concurrency: "unbounded" })
          )
          // Y is waiting on the holder before X comes (waited for: a fixed pause can be too short on a loaded
          // machine, and X would then not come after a batch that waits).
          const blockedByHolder = sql<{ n: number }>`
            SELECT count(*)::int AS n FROM pg_stat_activity WHERE ${holderPid} = ANY(pg_blocking_pids(pid))`
          for (let i = 0; i < 300 && (yield* blockedByHolder)[0]!.n === 0; i++)
            yield* Effect.sleep("100 millis")
          assert.isAbove((yield* blockedByHolder)[0]!.n, 0, "Y waits for shard 1")
          // A later turn of the same wallet: a release on shard 3 (which moves no wallet points) and a capture
          // on shard 5. Batched together, the release took shard 3 and the batch then waited for the wallet's
          // row, while Y held the row and would wait for shard 3: Postgres broke the cycle after a second.
          const x = yield* Effect.forkChild(
            Effect.all([settle(x1!, 0), settle(x2!, CHARGED)], { concurrency: "unbounded" })
          )
          yield* Effect.sleep("500 millis")
          yield* Deferred.succeed(letGo, undefined)
          yield* Fiber.join(holder)
          assert.deepStrictEqual(
            [...(yield* Fiber.join(y)), ...(yield* Fiber.join(x))],
            [true, true, true, true]
          )
          // Y, the release alone, X's capture: three statements, none of them a fallback's second try.
          assert.deepStrictEqual(statements(), { batched: 3, alone: 0 })
          const statuses = yield* Effect.forEach([y1!, y2!, x1!, x2!], (r) =>
            Effect.map(written(r.requestId), (rows) => rows.status)
          )
          assert.deepStrictEqual(statuses, ["captured", "captured", "released", "captured"])
        })
    )

    it.effect("a ledger shut down with a batch open sends it before it closes", () =>
      Effect.gen(function* () {
        const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
        const requests = yield* Effect.forEach(["credit", "x402", "credit"] as const, (p) => reserve(key, p))
        // A second ledger of its own (fresh: not the test layer's, memoized), closed while its batch waits for the
        // end of the turn.
        const scope = yield* Scope.make()
        const own = Context.get(yield* Layer.buildWithScope(Layer.fresh(Ledger.layer), scope), Ledger)
        exporter.reset()
        const fibers = yield* Effect.forEach(requests, (request) =>
          Effect.forkChild(own.capture(request.settle(CHARGED)))
        )
        // The captures run (and join one batch) before this fiber goes on; the batch waits one turn more.
        yield* Effect.yieldNow
        assert.deepStrictEqual(statements(), { batched: 0, alone: 0 })
        yield* Scope.close(scope, Exit.void)
        assert.deepStrictEqual(statements(), { batched: 1, alone: 0 })
        assert.deepStrictEqual(yield* Fiber.joinAll(fibers), [true, true, true])
        for (const request of requests) {
          assert.strictEqual((yield* written(request.requestId)).status, "captured")
        }
      })
    )

    /** A fresh ledger of its own whose told-first settlements linger `ms` (D573), closed by `scope`. */
    const lingeringLedger = (scope: Scope.Scope, ms: number) =>
      Effect.map(
        Layer.buildWithScope(
          Layer.fresh(Ledger.layer).pipe(
            Layer.provide(
              ConfigProvider.layerAdd(ConfigProvider.fromUnknown({ SETTLE_LINGER_MS: String(ms) }), {
                asPrimary: true
              })
            )
          ),
          scope
        ),
        (context) => Context.get(context, Ledger)
      )
    /** The capture of a request whose caller has its reply and whose lease stays warm (no row to end). */
    const toldFirst = (request: Reserved): CaptureRecord => ({
      ...request.settle(CHARGED),
      lease: undefined,
      linger: true
    })

    it.effect(
      "settlements told first wait for their wallet's later ones: one statement over several turns (D573)",
      () =>
        Effect.gen(function* () {
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const requests = yield* Effect.forEach(["credit", "x402", "credit", "credit"] as const, (p) =>
            reserve(key, p)
          )
          const scope = yield* Scope.make()
          const own = yield* lingeringLedger(scope, 400)
          exporter.reset()
          // One capture every 5 ms: each in a turn of its own, where turn batching wrote one statement each.
          const fibers: Array<Fiber.Fiber<boolean>> = []
          for (const request of requests) {
            fibers.push(yield* Effect.forkChild(own.capture(toldFirst(request))))
            yield* Effect.sleep(5)
          }
          assert.deepStrictEqual(statements(), { batched: 0, alone: 0 })
          assert.deepStrictEqual(yield* Fiber.joinAll(fibers), [true, true, true, true])
          assert.deepStrictEqual(statements(), { batched: 1, alone: 0 })
          for (const request of requests) {
            assert.strictEqual((yield* written(request.requestId)).status, "captured")
          }
          // A settlement that ends its lease's row, or one not told first, still goes at its turn's end.
          const [withLease, waited] = yield* Effect.forEach(["credit", "credit"] as const, (p) =>
            reserve(key, p)
          )
          exporter.reset()
          const started = Date.now()
          assert.isTrue(yield* own.capture({ ...withLease!.settle(CHARGED), linger: true }))
          assert.isTrue(yield* own.capture({ ...waited!.settle(CHARGED), lease: undefined }))
          assert.isBelow(Date.now() - started, 300)
          assert.deepStrictEqual(statements(), { batched: 2, alone: 0 })
          yield* Scope.close(scope, Exit.void)
        })
    )

    it.effect("a ledger shut down with a lingering batch open sends it at once", () =>
      Effect.gen(function* () {
        const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
        const requests = yield* Effect.forEach(["credit", "x402"] as const, (p) => reserve(key, p))
        const scope = yield* Scope.make()
        const own = yield* lingeringLedger(scope, 60_000)
        exporter.reset()
        const fibers = yield* Effect.forEach(requests, (request) =>
          Effect.forkChild(own.capture(toldFirst(request)))
        )
        yield* Effect.sleep(5)
        assert.deepStrictEqual(statements(), { batched: 0, alone: 0 })
        yield* Scope.close(scope, Exit.void)
        assert.deepStrictEqual(statements(), { batched: 1, alone: 0 })
        assert.deepStrictEqual(yield* Fiber.joinAll(fibers), [true, true])
        for (const request of requests) {
          assert.strictEqual((yield* written(request.requestId)).status, "captured")
        }
      })
    )
  })
})

/**
 * The router signer, refusing while `signing.fails` the first signature of each digest (the one asked for
 * before the receipt is stored); a later one (the pass's) is made.
 */
const signing = { fails: false }
const refused = new Set<string>()
const RefusingChain = Layer.effect(
  Chain,
  Effect.gen(function* () {
    const chain = yield* Chain
    return Chain.of({
      ...chain,
      signDigest: (digest) =>
        signing.fails && !refused.has(digest)
          ? Effect.andThen(
              Effect.sync(() => refused.add(digest)),
              Effect.fail(new ChainError({ reason: "Rpc", message: "signing refused by the test" }))
            )
          : chain.signDigest(digest)
    })
  })
).pipe(Layer.provide(Chain.layer))

describe("a receipt that cannot be signed as it is settled", () => {
  const Refusing = Layer.mergeAll(TestDatabase, RefusingChain)
  layer(Ledger.layer.pipe(Layer.provideMerge(Refusing)), { excludeTestServices: true, timeout: 60_000 })(
    (it) => {
      it.effect("is stored unsigned, the settlement unharmed, and signed shortly after by the pass", () =>
        Effect.gen(function* () {
          yield* holdFolds
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const [captured, released] = yield* Effect.forEach(["credit", "x402"] as const, (p) =>
            reserve(key, p)
          )
          signing.fails = true
          assert.isTrue(yield* settle(captured!, CHARGED))
          assert.isTrue(yield* settle(released!, 0))
          signing.fails = false
          for (const request of [captured!, released!]) {
            const rows = yield* written(request.requestId)
            assert.deepStrictEqual(
              { ...rows, entries: [...rows.entries].sort(), receipt: "any" },
              {
                ...expected(request, key.wallet, providerOf(request), request === captured ? CHARGED : 0),
                receipt: "any"
              }
            )
          }
          // Queued for the background pass (every 20 ms), which signs and stores them.
          for (const request of [captured!, released!]) {
            let stored = yield* storedReceipt(request.requestId)
            for (let i = 0; i < 250 && stored !== "signed by an update"; i++) {
              yield* Effect.sleep("20 millis")
              stored = yield* storedReceipt(request.requestId)
            }
            assert.strictEqual(stored, "signed by an update")
          }
        })
      )
    }
  )
})
