import { createServer, type Server } from "node:http"
import { assert, describe, layer } from "@effect/vitest"
import { ConfigProvider, Context, Deferred, Effect, Fiber, Layer, Result, Scope } from "effect"
import { SqlClient } from "effect/sql"
import {
  type Address,
  createTestClient,
  createWalletClient,
  encodeFunctionData,
  type Hash,
  http,
  parseTransaction,
  toHex
} from "viem"
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts"
import { testUsdcAbi } from "../../src/chain/artifacts.ts"
import { Chain, ChainError, type ChainShape } from "../../src/chain/Chain.ts"
import { devAccount } from "../../src/chain/DevAccounts.ts"
import { databaseFromUrl } from "../../src/db/Database.ts"
import type { OutgoingTransfer } from "../../src/ledger/Transfers.ts"
import { Treasury } from "../../src/ledger/Treasury.ts"
import { freshDatabaseUrl } from "../support/Database.ts"
import { fundTreasury } from "./support.ts"

/**
 * The exactly-once sender against the real local Anvil and a real Postgres: every doubt a transfer can
 * meet (a crash between record and broadcast, a broadcast the node never got, a reply that never came,
 * the RPC down, a restart with transactions in flight, a nonce taken by someone else, two instances on
 * one database) ends with exactly one transfer on chain per purpose, checked by balances and nonces.
 */

class DatabaseUrl extends Context.Service<DatabaseUrl, string>()("test/DatabaseUrl") {}

const Database = Layer.unwrap(
  Effect.map(freshDatabaseUrl, (url) => Layer.merge(databaseFromUrl(url), Layer.succeed(DatabaseUrl, url)))
)
// An empty provider: RPC_URL is unset whatever the environment says, so the layer starts its own Anvil.
const EmbeddedChain = Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))

const devKey = (index: number) => toHex(devAccount(index).getHdKey().privateKey!)

/** The same chain seen through another RPC URL (a proxy, or a second instance's own client). */
const externalChain = (embedded: ChainShape, rpcUrl: string) =>
  Chain.useSync((chain) => chain).pipe(
    Effect.provide(
      Layer.fresh(Chain.layer).pipe(
        Layer.provide(
          ConfigProvider.layer(
            ConfigProvider.fromEnvRecord({
              RPC_URL: rpcUrl,
              CHAIN_ID: String(embedded.chainId),
              ROUTER_PRIVATE_KEY: devKey(0),
              TREASURY_PRIVATE_KEY: devKey(1),
              TREASURY_ADDRESS: embedded.treasury.toLowerCase(),
              TOKEN_ADDRESS: embedded.token,
              ANCHOR_ADDRESS: embedded.anchor
            })
          )
        )
      )
    )
  )

type ProxyMode = "up" | "down" | "loseBroadcast" | "loseReply"

/**
 * A JSON-RPC proxy in front of Anvil that can fail the way a network does: `down` answers every call
 * 502; `loseBroadcast` drops `eth_sendRawTransaction` before the node sees it; `loseReply` forwards it
 * and then answers 502, so the node has the transaction and the sender does not know.
 */
const rpcProxy = (target: string) =>
  Effect.acquireRelease(
    Effect.callback<{ url: string; server: Server; set: (mode: ProxyMode) => void }>((resume) => {
      let mode: ProxyMode = "up"
      const server = createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (chunk: Buffer) => chunks.push(chunk))
        req.on("end", () => {
          const body = Buffer.concat(chunks).toString()
          const broadcast = body.includes("eth_sendRawTransaction")
          const fail = () => {
            res.writeHead(502)
            res.end()
          }
          if (mode === "down" || (mode === "loseBroadcast" && broadcast)) return fail()
          fetch(target, { method: "POST", headers: { "content-type": "application/json" }, body })
            .then(async (reply) => {
              const text = await reply.text()
              if (mode === "loseReply" && broadcast) return fail()
              res.writeHead(reply.status, { "content-type": "application/json" })
              res.end(text)
            })
            .catch(fail)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        const port = typeof address === "object" && address !== null ? address.port : 0
        resume(
          Effect.succeed({
            url: `http://127.0.0.1:${port}`,
            server,
            set: (next: ProxyMode) => {
              mode = next
            }
          })
        )
      })
    }),
    ({ server }) =>
      Effect.callback<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )

const anvilOf = (chain: ChainShape) => createTestClient({ mode: "anvil", transport: http(chain.rpcUrl) })

/** Automine off for the rest of the scope (a pool that holds transactions until told to mine). */
const holdBlocks = Effect.gen(function* () {
  const anvil = anvilOf(yield* Chain)
  yield* Effect.acquireRelease(
    Effect.promise(() => anvil.setAutomine(false)),
    () => Effect.promise(() => anvil.setAutomine(true))
  )
  return anvil
})

const freshAddress = (): Address => privateKeyToAccount(generatePrivateKey()).address

const withdrawal = (to: Address, amount: bigint, id = `wd_${Math.random().toString(36).slice(2)}`) =>
  ({ _tag: "Withdrawal", withdrawalId: id, to, amount }) satisfies OutgoingTransfer

/** Token balance and the payer's mined nonce: the two things that say how many transfers happened. */
const onChain = (to: Address) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    return {
      balance: yield* chain.balanceOf(to),
      nonce: yield* chain.outgoing.minedNonce(chain.payer)
    }
  }).pipe(Effect.orDie)

const records = (purposePrefix: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    return yield* sql<{ purpose: string; status: string; nonce: string; tx_hash: string }>`
      SELECT purpose, status, nonce::text AS nonce, tx_hash FROM outgoing_transactions
      WHERE purpose LIKE ${`${purposePrefix}%`} ORDER BY outgoing_transactions.nonce`
  }).pipe(Effect.orDie)

/** Every Transfer of the token to `to` since genesis: a second payment would show here. */
const transfersTo = (to: Address) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    return yield* chain.readTransferLogs({ fromBlock: 0n, toBlock: yield* chain.blockNumber(), to })
  }).pipe(Effect.orDie)

/** Two treasuries on one database, the second with its own database pool and its own chain client. */
const twoInstances = Effect.gen(function* () {
  const embedded = yield* Chain
  const url = yield* DatabaseUrl
  const otherChain = yield* externalChain(embedded, embedded.rpcUrl)
  const otherSql = yield* Layer.build(databaseFromUrl(url)).pipe(
    Effect.map((c) => Context.get(c, SqlClient.SqlClient))
  )
  const a = yield* Treasury.make()
  const b = yield* Treasury.make().pipe(
    Effect.provideService(Chain, otherChain),
    Effect.provideService(SqlClient.SqlClient, otherSql)
  )
  return { a, b }
})

/** Recipient `i` got `first + i`, in exactly one transfer. */
const paidOnce = (recipients: ReadonlyArray<Address>, first: bigint) =>
  Effect.forEach(recipients, (to, i) =>
    Effect.gen(function* () {
      assert.strictEqual((yield* onChain(to)).balance, first + BigInt(i))
      assert.lengthOf(yield* transfersTo(to), 1)
    })
  )

/** A Treasury over a chain with some outgoing operations replaced (the database is the real one). */
const treasuryWith = (patch: (chain: ChainShape) => Partial<ChainShape["outgoing"]>) =>
  Effect.gen(function* () {
    const chain = yield* Chain
    const patched: ChainShape = { ...chain, outgoing: { ...chain.outgoing, ...patch(chain) } }
    return yield* Treasury.make({ confirmTimeout: "5 seconds" }).pipe(Effect.provideService(Chain, patched))
  })

/** A first instance records `transfer` and dies before its broadcast: a `signed` record nobody offered. */
const recordedByTheDead = (transfer: OutgoingTransfer) =>
  Effect.gen(function* () {
    const reached = yield* Deferred.make<void>()
    const dying = yield* treasuryWith(() => ({
      broadcast: () => Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
    }))
    const fiber = yield* Effect.forkChild(dying.sendMany([transfer]))
    yield* Deferred.await(reached)
    yield* Fiber.interrupt(fiber)
  })

describe("Treasury: every transfer exactly once, on a real chain and database", () => {
  layer(Layer.merge(Database, EmbeddedChain), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a transfer is recorded before broadcast, and sending its purpose again adopts it", () =>
      Effect.gen(function* () {
        yield* fundTreasury(50_000_000n)
        const treasury = yield* Treasury.make()
        const to = freshAddress()
        const before = yield* onChain(to)
        const transfer = withdrawal(to, 1_234n)
        const hash = yield* treasury.send(transfer)
        assert.strictEqual((yield* treasury.confirm(hash)).status, "success")
        // The caller lost its hash and sends again: the same transaction, no second transfer.
        assert.strictEqual(yield* treasury.send(transfer), hash)
        assert.strictEqual(yield* treasury.recorded(transfer), hash)
        const after = yield* onChain(to)
        assert.strictEqual(after.balance, 1_234n)
        assert.strictEqual(after.nonce, before.nonce + 1)
        const [row] = yield* records(`withdrawal:${transfer.withdrawalId}`)
        assert.strictEqual(row!.status, "mined")
        assert.strictEqual(Number(row!.nonce), before.nonce)
      })
    )

    it.effect("a sender's row is written once per process, not in every send's transaction", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        yield* fundTreasury(50_000_000n)
        // Counts the INSERT statements on treasury_senders (a statement trigger fires on a conflict too).
        yield* sql.unsafe("CREATE TABLE sender_inserts (n INT NOT NULL)")
        yield* sql.unsafe("INSERT INTO sender_inserts VALUES (0)")
        yield* sql.unsafe(`CREATE FUNCTION count_sender_insert() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN UPDATE sender_inserts SET n = n + 1; RETURN NULL; END $$`)
        yield* sql.unsafe(`CREATE TRIGGER count_sender_insert BEFORE INSERT ON treasury_senders
          FOR EACH STATEMENT EXECUTE FUNCTION count_sender_insert()`)
        const treasury = yield* Treasury.make()
        for (const amount of [1_000n, 2_000n, 3_000n]) {
          const hash = yield* treasury.send(withdrawal(freshAddress(), amount))
          assert.strictEqual((yield* treasury.confirm(hash)).status, "success")
        }
        const [counted] = yield* sql<{ n: number }>`SELECT n FROM sender_inserts`
        assert.strictEqual(counted!.n, 1)
        yield* sql.unsafe("DROP TRIGGER count_sender_insert ON treasury_senders")
      }).pipe(Effect.orDie)
    )

    it.effect(
      "killed between signing and recording: nothing recorded, nothing sent, the nonce still free",
      () =>
        Effect.gen(function* () {
          const to = freshAddress()
          const before = yield* onChain(to)
          const transfer = withdrawal(to, 888n)
          const reached = yield* Deferred.make<void>()
          // The process dies after signing, inside the database transaction that would record it.
          const dying = yield* treasuryWith((chain) => ({
            sign: (call, plan, nonce) =>
              Effect.andThen(chain.outgoing.sign(call, plan, nonce), () =>
                Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
              )
          }))
          const fiber = yield* Effect.forkChild(dying.send(transfer))
          yield* Deferred.await(reached)
          yield* Fiber.interrupt(fiber)
          assert.lengthOf(yield* records(`withdrawal:${transfer.withdrawalId}`), 0)
          assert.deepStrictEqual(yield* onChain(to), before)

          const restarted = yield* Treasury.make()
          const hash = yield* restarted.send(transfer)
          assert.strictEqual((yield* restarted.confirm(hash)).status, "success")
          const [row] = yield* records(`withdrawal:${transfer.withdrawalId}`)
          assert.strictEqual(Number(row!.nonce), before.nonce)
          assert.deepStrictEqual(yield* onChain(to), { balance: 888n, nonce: before.nonce + 1 })
        })
    )

    it.effect("killed between record and broadcast: recovery broadcasts the recorded bytes, once", () =>
      Effect.gen(function* () {
        const to = freshAddress()
        const before = yield* onChain(to)
        const transfer = withdrawal(to, 777n)
        const reached = yield* Deferred.make<void>()
        // The process dies right after the commit: the broadcast never starts.
        const dying = yield* treasuryWith(() => ({
          broadcast: () => Effect.andThen(Deferred.succeed(reached, undefined), Effect.never)
        }))
        const fiber = yield* Effect.forkChild(dying.send(transfer))
        yield* Deferred.await(reached)
        yield* Fiber.interrupt(fiber)
        const [recorded] = yield* records(`withdrawal:${transfer.withdrawalId}`)
        assert.strictEqual(recorded!.status, "signed")
        assert.deepStrictEqual(yield* onChain(to), before)

        // A restarted instance: recovery at start finds it, the chain mines the very bytes recorded.
        const restarted = yield* Treasury.make()
        yield* restarted.recover
        assert.strictEqual((yield* restarted.confirm(recorded!.tx_hash as Hash)).status, "success")
        // The caller resumes its claim and sends again: adopted.
        assert.strictEqual(yield* restarted.send(transfer), recorded!.tx_hash)
        assert.strictEqual(yield* restarted.recover, 0)
        const after = yield* onChain(to)
        assert.strictEqual(after.balance, 777n)
        assert.strictEqual(after.nonce, before.nonce + 1)
        assert.lengthOf(yield* transfersTo(to), 1)
      })
    )

    it.effect("a broadcast dropped from the mempool is rebroadcast, not replaced", () =>
      Effect.gen(function* () {
        const to = freshAddress()
        const before = yield* onChain(to)
        const treasury = yield* Treasury.make({ confirmTimeout: "20 seconds" })
        const hash = yield* Effect.scoped(
          Effect.gen(function* () {
            const anvil = yield* holdBlocks
            const sent = yield* treasury.send(withdrawal(to, 555n))
            yield* Effect.promise(() => anvil.dropTransaction({ hash: sent }))
            return sent
          })
        )
        // Blocks flow again; the node no longer has the transaction: `confirm` offers the same bytes.
        const outcome = yield* treasury.confirm(hash)
        assert.strictEqual(outcome.status, "success")
        const after = yield* onChain(to)
        assert.strictEqual(after.balance, 555n)
        assert.strictEqual(after.nonce, before.nonce + 1)
        assert.lengthOf(yield* transfersTo(to), 1)
      })
    )

    it.effect(
      "two lost broadcasts below a waited transfer: each filled in turn, every transfer once (D427)",
      () =>
        Effect.gen(function* () {
          const [a, b, c] = [freshAddress(), freshAddress(), freshAddress()]
          const before = yield* onChain(a)
          const treasury = yield* Treasury.make({ confirmTimeout: "30 seconds" })
          const top = yield* Effect.scoped(
            Effect.gen(function* () {
              const anvil = yield* holdBlocks
              const lowest = yield* treasury.send(withdrawal(a, 11n))
              const middle = yield* treasury.send(withdrawal(b, 22n))
              const sent = yield* treasury.send(withdrawal(c, 33n))
              for (const hash of [lowest, middle])
                yield* Effect.promise(() => anvil.dropTransaction({ hash }))
              return sent
            })
          )
          // Blocks flow again: the highest waits on two gaps; the look fills the lowest, then the next.
          assert.strictEqual((yield* treasury.confirm(top)).status, "success")
          assert.strictEqual((yield* onChain(a)).balance, 11n)
          assert.strictEqual((yield* onChain(b)).balance, 22n)
          assert.strictEqual((yield* onChain(c)).balance, 33n)
          assert.strictEqual((yield* onChain(a)).nonce, before.nonce + 3)
          for (const to of [a, b, c]) assert.lengthOf(yield* transfersTo(to), 1)
        })
    )

    it.effect(
      "the RPC loses a broadcast, loses a reply, then goes down and comes back: one transfer each",
      () =>
        Effect.gen(function* () {
          const embedded = yield* Chain
          const proxy = yield* rpcProxy(embedded.rpcUrl)
          const viaProxy = yield* externalChain(embedded, proxy.url)
          const treasury = yield* Treasury.make({ confirmTimeout: "5 seconds" }).pipe(
            Effect.provideService(Chain, viaProxy)
          )
          const [lost, unanswered, offline] = [freshAddress(), freshAddress(), freshAddress()]
          const before = yield* onChain(lost)

          // The node never gets the broadcast: the send still answers with the recorded hash.
          proxy.set("loseBroadcast")
          const lostHash = yield* treasury.send(withdrawal(lost, 101n))
          assert.strictEqual((yield* onChain(lost)).balance, 0n)
          // The node takes it but the reply is lost: the caller cannot tell this case from the first.
          proxy.set("loseReply")
          const unansweredHash = yield* treasury.send(withdrawal(unanswered, 202n))
          proxy.set("up")
          assert.strictEqual((yield* treasury.confirm(unansweredHash)).status, "success")
          assert.strictEqual((yield* treasury.confirm(lostHash)).status, "success")

          // Down before anything is recorded: the send fails and nothing is signed.
          proxy.set("down")
          const transfer = withdrawal(offline, 303n)
          const refused = yield* Effect.flip(treasury.send(transfer))
          assert.instanceOf(refused, ChainError)
          assert.isUndefined(yield* treasury.recorded(transfer))
          proxy.set("up")
          const hash = yield* treasury.send(transfer)
          // Down between the send and the wait: the wait fails, the transfer stays recorded.
          proxy.set("down")
          assert.instanceOf(yield* Effect.flip(treasury.confirm(hash)), ChainError)
          proxy.set("up")
          assert.strictEqual((yield* treasury.confirm(hash)).status, "success")
          assert.strictEqual(yield* treasury.send(transfer), hash)

          assert.strictEqual((yield* onChain(lost)).balance, 101n)
          assert.strictEqual((yield* onChain(unanswered)).balance, 202n)
          assert.strictEqual((yield* onChain(offline)).balance, 303n)
          assert.strictEqual((yield* onChain(lost)).nonce, before.nonce + 3)
          for (const to of [lost, unanswered, offline]) assert.lengthOf(yield* transfersTo(to), 1)
        }),
      { timeout: 120_000 }
    )

    it.effect(
      "restart mid-flight: transactions in the pool are lost with the node's pool, the next instance mines each once",
      () =>
        Effect.gen(function* () {
          const recipients = [freshAddress(), freshAddress(), freshAddress()]
          const transfers = recipients.map((to, i) => withdrawal(to, 1_000n + BigInt(i)))
          const before = yield* onChain(recipients[0]!)
          const hashes = yield* Effect.scoped(
            Effect.gen(function* () {
              const anvil = yield* holdBlocks
              // The first instance runs with its recovery loop, sends three transfers, and dies.
              const first = yield* Scope.make()
              const treasury = yield* Layer.buildWithScope(Treasury.layer, first).pipe(
                Effect.map((context) => Context.get(context, Treasury))
              )
              const sent = yield* Effect.forEach(transfers, treasury.send)
              yield* Scope.close(first, { _tag: "Success", value: undefined } as never)
              // The node restarts with an empty pool.
              for (const hash of sent) yield* Effect.promise(() => anvil.dropTransaction({ hash }))
              assert.deepStrictEqual(yield* onChain(recipients[0]!), { balance: 0n, nonce: before.nonce })
              return sent
            })
          )
          // The next instance's recovery loop runs at start: every recorded transaction, in nonce order.
          const second = yield* Layer.build(Treasury.layer).pipe(Effect.map((c) => Context.get(c, Treasury)))
          for (const hash of hashes) assert.strictEqual((yield* second.confirm(hash)).status, "success")
          // Callers resuming their claims get the same transactions.
          assert.deepStrictEqual(yield* Effect.forEach(transfers, second.send), hashes)
          yield* paidOnce(recipients, 1_000n)
          assert.strictEqual((yield* onChain(recipients[0]!)).nonce, before.nonce + 3)
        })
    )

    it.effect(
      "a nonce taken by another transaction voids the recorded one; the purpose is then sent once, anew",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          const to = freshAddress()
          const bystander = freshAddress()
          const before = yield* onChain(to)
          const treasury = yield* Treasury.make({ confirmTimeout: "10 seconds" })
          const transfer = withdrawal(to, 4_242n)
          const first = yield* Effect.scoped(
            Effect.gen(function* () {
              const anvil = yield* holdBlocks
              const hash = yield* treasury.send(transfer)
              yield* Effect.promise(() => anvil.dropTransaction({ hash }))
              // Someone else with the key (an operator's wallet) uses that nonce for another transfer.
              const operator = createWalletClient({
                account: privateKeyToAccount(devKey(1)),
                chain: chain.publicClient.chain,
                transport: http(chain.rpcUrl)
              })
              yield* Effect.promise(() =>
                operator.sendTransaction({
                  to: chain.token,
                  data: encodeFunctionData({
                    abi: testUsdcAbi,
                    functionName: "transfer",
                    args: [bystander, 1n]
                  }),
                  nonce: before.nonce
                })
              )
              yield* Effect.promise(() => anvil.mine({ blocks: 1 }))
              return hash
            })
          )
          assert.strictEqual((yield* treasury.confirm(first)).status, "replaced")
          assert.isUndefined(yield* treasury.recorded(transfer))
          // Nothing moved for this purpose: the caller's retry signs a new attempt with the next nonce.
          const second = yield* treasury.send(transfer)
          assert.notStrictEqual(second, first)
          assert.strictEqual((yield* treasury.confirm(second)).status, "success")
          const rows = yield* records(`withdrawal:${transfer.withdrawalId}`)
          assert.deepStrictEqual(
            rows.map((r) => [r.status, Number(r.nonce)]),
            [
              ["void", before.nonce],
              ["mined", before.nonce + 1]
            ]
          )
          assert.strictEqual((yield* onChain(to)).balance, 4_242n)
          assert.lengthOf(yield* transfersTo(to), 1)
        })
    )

    it.effect(
      "the kept nonce is trusted after one ask of the node; a nonce taken outside is found at broadcast and the purpose still lands once (D331)",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          yield* fundTreasury(1_000_000n)
          let asked = 0
          const treasury = yield* treasuryWith((chain) => ({
            minedNonce: (address) =>
              Effect.andThen(
                Effect.sync(() => asked++),
                chain.outgoing.minedNonce(address)
              )
          }))
          for (const amount of [11n, 12n, 13n]) {
            const hash = yield* treasury.send(withdrawal(freshAddress(), amount))
            assert.strictEqual((yield* treasury.confirm(hash)).status, "success")
          }
          // One ask for three sends: the kept nonce was authoritative after it.
          assert.strictEqual(asked, 1)

          // Someone else with the key uses the next two nonces: the kept one is now two behind the chain.
          const taken = (yield* onChain(freshAddress())).nonce
          const operator = createWalletClient({
            account: privateKeyToAccount(devKey(1)),
            chain: chain.publicClient.chain,
            transport: http(chain.rpcUrl)
          })
          for (const nonce of [taken, taken + 1]) {
            const hash = yield* Effect.promise(() =>
              operator.sendTransaction({
                to: chain.token,
                data: encodeFunctionData({
                  abi: testUsdcAbi,
                  functionName: "transfer",
                  args: [freshAddress(), 1n]
                }),
                nonce
              })
            )
            yield* Effect.promise(() => chain.publicClient.waitForTransactionReceipt({ hash }))
          }

          const to = freshAddress()
          const transfer = withdrawal(to, 4_321n)
          const hash = yield* treasury.send(transfer)
          assert.strictEqual((yield* treasury.confirm(hash)).status, "success")
          // The stale attempt is void (never mined), the one signed after asking the node again landed.
          const rows = yield* records(`withdrawal:${transfer.withdrawalId}`)
          assert.deepStrictEqual(
            rows.map((r) => [r.status, Number(r.nonce)]),
            [
              ["void", taken],
              ["mined", taken + 2]
            ]
          )
          assert.strictEqual((yield* onChain(to)).balance, 4_321n)
          assert.lengthOf(yield* transfersTo(to), 1)
          // Trusted again after that ask: the next send asks nothing.
          const before = asked
          const next = yield* treasury.send(withdrawal(freshAddress(), 14n))
          assert.strictEqual((yield* treasury.confirm(next)).status, "success")
          assert.strictEqual(asked, before)
        })
    )

    it.effect(
      "two router instances on one database send at once: one nonce sequence, one transfer per purpose",
      () =>
        Effect.gen(function* () {
          const { a, b } = yield* twoInstances
          const recipients = Array.from({ length: 12 }, freshAddress)
          const transfers = recipients.map((to, i) => withdrawal(to, 10_000n + BigInt(i), `wd_pair_${i}`))
          const before = yield* onChain(recipients[0]!)
          // Every transfer is sent by both instances at the same time.
          const sent = yield* Effect.forEach(
            [...transfers.map((t) => [a, t] as const), ...transfers.map((t) => [b, t] as const)],
            ([treasury, transfer]) => treasury.send(transfer),
            { concurrency: "unbounded" }
          )
          assert.deepStrictEqual(sent.slice(0, 12), sent.slice(12))
          yield* Effect.forEach(sent.slice(0, 12), (hash) => a.confirm(hash), { concurrency: 4 })
          yield* paidOnce(recipients, 10_000n)
          assert.strictEqual((yield* onChain(recipients[0]!)).nonce, before.nonce + 12)
          const rows = yield* records("withdrawal:wd_pair_")
          assert.lengthOf(rows, 12)
          assert.deepStrictEqual(
            rows.map((r) => Number(r.nonce)),
            Array.from({ length: 12 }, (_, i) => before.nonce + i)
          )
        })
    )
  })
})

/** The hash of each transfer a batch sent; fails the test on a transfer it refused. */
const hashesOf = (sent: ReadonlyArray<Result.Result<Hash, ChainError>>) =>
  sent.map((result, i) => {
    if (Result.isFailure(result)) return assert.fail(`transfer ${i} refused: ${result.failure.message}`)
    return result.success
  })

/**
 * How many database transactions recorded these transfers: a record's `created_at` is its transaction's start
 * (`now()`), which later updates leave alone (they do move `xmin`).
 */
const writersOf = (purposePrefix: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [row] = yield* sql<{ n: number }>`
      SELECT count(DISTINCT created_at)::int AS n FROM outgoing_transactions WHERE purpose LIKE ${`${purposePrefix}%`}`
    return row!.n
  }).pipe(Effect.orDie)

describe("Treasury.sendMany and confirmMany: a batch of transfers, each exactly once (D490, D491)", () => {
  layer(Layer.merge(Database, EmbeddedChain), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect(
      "a batch is recorded whole in one transaction, with consecutive nonces, before its first broadcast",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          yield* fundTreasury(50_000_000n)
          const recipients = Array.from({ length: 8 }, freshAddress)
          const transfers = recipients.map((to, i) => withdrawal(to, 100n + BigInt(i), `wd_batch_${i}`))
          const before = yield* onChain(recipients[0]!)
          // What the database holds when the first broadcast starts.
          let recordedAtFirstBroadcast: number | undefined
          const treasury = yield* treasuryWith((chain) => ({
            broadcast: (raw) =>
              Effect.gen(function* () {
                if (recordedAtFirstBroadcast === undefined) {
                  const [row] = yield* sql<{ n: number }>`
                    SELECT count(*)::int AS n FROM outgoing_transactions WHERE purpose LIKE 'withdrawal:wd_batch_%'`.pipe(
                    Effect.orDie
                  )
                  recordedAtFirstBroadcast = row!.n
                }
                return yield* chain.outgoing.broadcast(raw)
              })
          }))
          const hashes = hashesOf(yield* treasury.sendMany(transfers))
          assert.strictEqual(recordedAtFirstBroadcast, 8)
          const rows = yield* records("withdrawal:wd_batch_")
          assert.deepStrictEqual(
            rows.map((r) => [r.purpose, Number(r.nonce), r.tx_hash]),
            transfers.map((t, i) => [`withdrawal:${t.withdrawalId}`, before.nonce + i, hashes[i]])
          )
          assert.strictEqual(yield* writersOf("withdrawal:wd_batch_"), 1)
          const outcomes = yield* treasury.confirmMany(hashes)
          assert.deepStrictEqual(
            outcomes.map((o) => Result.isSuccess(o) && o.success.status),
            hashes.map(() => "success" as const)
          )
          yield* paidOnce(recipients, 100n)
          assert.strictEqual((yield* onChain(recipients[0]!)).nonce, before.nonce + 8)
          // Sent again whole: every purpose adopted, nothing signed.
          assert.deepStrictEqual(hashesOf(yield* treasury.sendMany(transfers)), hashes)
          assert.lengthOf(yield* records("withdrawal:wd_batch_"), 8)
        })
    )

    it.effect(
      "a purpose recorded by an instance that died before broadcasting is adopted and rebroadcast, never signed again",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          const [early, a, b] = [freshAddress(), freshAddress(), freshAddress()]
          const before = yield* onChain(early)
          const orphan = withdrawal(early, 31n, "wd_orphan")
          // The first instance records the transfer and dies before its broadcast.
          yield* recordedByTheDead(orphan)
          const [recorded] = yield* records("withdrawal:wd_orphan")
          assert.strictEqual(recorded!.status, "signed")

          // The next instance sends a batch holding that purpose: adopted (its recorded bytes offered), the
          // others signed after it.
          const treasury = yield* Treasury.make({ confirmTimeout: "20 seconds" })
          const batch = [withdrawal(a, 32n, "wd_orphan_a"), orphan, withdrawal(b, 33n, "wd_orphan_b")]
          const hashes = hashesOf(yield* treasury.sendMany(batch))
          assert.strictEqual(hashes[1], recorded!.tx_hash)
          const rows = yield* records("withdrawal:wd_orphan")
          assert.deepStrictEqual(
            rows.map((r) => [r.purpose, Number(r.nonce)]),
            [
              ["withdrawal:wd_orphan", before.nonce],
              ["withdrawal:wd_orphan_a", before.nonce + 1],
              ["withdrawal:wd_orphan_b", before.nonce + 2]
            ]
          )
          for (const outcome of yield* treasury.confirmMany(hashes))
            assert.isTrue(Result.isSuccess(outcome) && outcome.success.status === "success")
          assert.deepStrictEqual(yield* onChain(early), { balance: 31n, nonce: before.nonce + 3 })
          for (const to of [early, a, b]) assert.lengthOf(yield* transfersTo(to), 1)
        })
    )

    it.effect("a transfer whose estimate reverts fails alone: the others are recorded and land", () =>
      Effect.gen(function* () {
        const chain = yield* Chain
        yield* fundTreasury(1_000_000n)
        const [a, b, c] = [freshAddress(), freshAddress(), freshAddress()]
        const before = yield* onChain(a)
        const treasury = yield* Treasury.make()
        // More than the treasury holds: the token's transfer reverts at estimation.
        const tooMuch = (yield* chain.balanceOf(chain.treasury).pipe(Effect.orDie)) + 1n
        const sent = yield* treasury.sendMany([
          withdrawal(a, 41n, "wd_revert_a"),
          withdrawal(b, tooMuch, "wd_revert_b"),
          withdrawal(c, 43n, "wd_revert_c")
        ])
        assert.isTrue(Result.isFailure(sent[1]!))
        if (Result.isFailure(sent[1]!)) assert.strictEqual(sent[1].failure.reason, "Reverted")
        const hashes = hashesOf([sent[0]!, sent[2]!])
        const rows = yield* records("withdrawal:wd_revert_")
        assert.deepStrictEqual(
          rows.map((r) => [r.purpose, Number(r.nonce)]),
          [
            ["withdrawal:wd_revert_a", before.nonce],
            ["withdrawal:wd_revert_c", before.nonce + 1]
          ]
        )
        for (const outcome of yield* treasury.confirmMany(hashes))
          assert.isTrue(Result.isSuccess(outcome) && outcome.success.status === "success")
        assert.strictEqual((yield* onChain(a)).balance, 41n)
        assert.strictEqual((yield* onChain(b)).balance, 0n)
        assert.strictEqual((yield* onChain(c)).balance, 43n)
      })
    )

    it.effect(
      "a nonce taken outside is found at broadcast: that purpose alone is signed again, the batch lands once (D331)",
      () =>
        Effect.gen(function* () {
          const chain = yield* Chain
          yield* fundTreasury(1_000_000n)
          const treasury = yield* Treasury.make({ confirmTimeout: "20 seconds" })
          // One send makes the kept nonce trusted: the batch below asks the node nothing.
          const warm = yield* treasury.send(withdrawal(freshAddress(), 1n))
          assert.strictEqual((yield* treasury.confirm(warm)).status, "success")
          const taken = (yield* onChain(freshAddress())).nonce
          const operator = createWalletClient({
            account: privateKeyToAccount(devKey(1)),
            chain: chain.publicClient.chain,
            transport: http(chain.rpcUrl)
          })
          const foreign = yield* Effect.promise(() =>
            operator.sendTransaction({
              to: chain.token,
              data: encodeFunctionData({
                abi: testUsdcAbi,
                functionName: "transfer",
                args: [freshAddress(), 1n]
              }),
              nonce: taken
            })
          )
          yield* Effect.promise(() => chain.publicClient.waitForTransactionReceipt({ hash: foreign }))
          const recipients = [freshAddress(), freshAddress(), freshAddress()]
          const batch = recipients.map((to, i) => withdrawal(to, 51n + BigInt(i), `wd_taken_${i}`))
          const hashes = hashesOf(yield* treasury.sendMany(batch))
          for (const outcome of yield* treasury.confirmMany(hashes))
            assert.isTrue(Result.isSuccess(outcome) && outcome.success.status === "success")
          const rows = yield* records("withdrawal:wd_taken_")
          assert.deepStrictEqual(
            rows.map((r) => [r.purpose, r.status, Number(r.nonce)]),
            [
              ["withdrawal:wd_taken_0", "void", taken],
              ["withdrawal:wd_taken_1", "mined", taken + 1],
              ["withdrawal:wd_taken_2", "mined", taken + 2],
              ["withdrawal:wd_taken_0", "mined", taken + 3]
            ]
          )
          yield* paidOnce(recipients, 51n)
        })
    )

    it.effect(
      "confirmMany fills the gaps below its batch, lost transfers not in it included, each looked at once a look (D169, D427)",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          const recipients = Array.from({ length: 5 }, freshAddress)
          const before = yield* onChain(recipients[0]!)
          const treasury = yield* Treasury.make({ confirmTimeout: "30 seconds" })
          const batch = yield* Effect.scoped(
            Effect.gen(function* () {
              const anvil = yield* holdBlocks
              // Two transfers sent on their own, then a batch of three; the pool loses both singles and the
              // batch's lowest, so the batch waits on gaps only a look below it can fill.
              const lowest = yield* treasury.send(withdrawal(recipients[0]!, 61n))
              const next = yield* treasury.send(withdrawal(recipients[1]!, 62n))
              const sent = hashesOf(
                yield* treasury.sendMany(recipients.slice(2).map((to, i) => withdrawal(to, 63n + BigInt(i))))
              )
              for (const hash of [lowest, next, sent[0]!])
                yield* Effect.promise(() => anvil.dropTransaction({ hash }))
              return sent
            })
          )
          const outcomes = yield* treasury.confirmMany(batch)
          for (const outcome of outcomes)
            assert.isTrue(
              Result.isSuccess(outcome) && outcome.success.status === "success",
              Result.isFailure(outcome) ? outcome.failure.message : ""
            )
          yield* paidOnce(recipients, 61n)
          assert.strictEqual((yield* onChain(recipients[0]!)).nonce, before.nonce + 5)
        })
    )

    it.effect(
      "two instances send the same batch at once: one record per purpose, one nonce sequence, one transfer each",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          const { a, b } = yield* twoInstances
          const recipients = Array.from({ length: 12 }, freshAddress)
          const transfers = recipients.map((to, i) => withdrawal(to, 20_000n + BigInt(i), `wd_both_${i}`))
          const before = yield* onChain(recipients[0]!)
          // Halves and the whole, from both instances at once: every purpose meets a rival for its lock.
          const [whole, first, second] = yield* Effect.all(
            [a.sendMany(transfers), b.sendMany(transfers.slice(0, 6)), b.sendMany(transfers.slice(6))],
            { concurrency: "unbounded" }
          )
          const hashes = hashesOf(whole!)
          assert.deepStrictEqual([...hashesOf(first!), ...hashesOf(second!)], hashes)
          for (const outcome of yield* b.confirmMany(hashes))
            assert.isTrue(Result.isSuccess(outcome) && outcome.success.status === "success")
          yield* paidOnce(recipients, 20_000n)
          const rows = yield* records("withdrawal:wd_both_")
          assert.lengthOf(rows, 12)
          assert.deepStrictEqual(
            rows.map((r) => Number(r.nonce)),
            Array.from({ length: 12 }, (_, i) => before.nonce + i)
          )
          assert.strictEqual((yield* onChain(recipients[0]!)).nonce, before.nonce + 12)
        })
    )
  })
})

describe("Treasury.sendMany broadcasts each sender's transfers one at a time, in nonce order (D517)", () => {
  layer(Layer.merge(Database, EmbeddedChain), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect(
      "an adopted record below the new ones goes first, and no broadcast starts before the one below it is answered",
      () =>
        Effect.gen(function* () {
          yield* fundTreasury(1_000_000n)
          const recipients = Array.from({ length: 6 }, freshAddress)
          const before = yield* onChain(recipients[0]!)
          const orphan = withdrawal(recipients[0]!, 71n, "wd_order_orphan")
          // A first instance records one transfer and dies before its broadcast: the lowest nonce, adopted below.
          yield* recordedByTheDead(orphan)
          // Each broadcast's nonce as it starts, and how many were in flight then; every answer a little late.
          const started: Array<number> = []
          let inFlight = 0
          let most = 0
          const treasury = yield* treasuryWith((chain) => ({
            broadcast: (raw) =>
              Effect.gen(function* () {
                started.push(parseTransaction(raw).nonce!)
                most = Math.max(most, ++inFlight)
                yield* Effect.sleep("20 millis")
                return yield* chain.outgoing.broadcast(raw)
              }).pipe(
                Effect.ensuring(
                  Effect.sync(() => {
                    inFlight--
                  })
                )
              )
          }))
          // The new transfers first in the batch, the adopted one last.
          const batch = [
            ...recipients.slice(1).map((to, i) => withdrawal(to, 72n + BigInt(i), `wd_order_${i}`)),
            orphan
          ]
          const hashes = hashesOf(yield* treasury.sendMany(batch))
          assert.deepStrictEqual(
            started,
            Array.from({ length: 6 }, (_, i) => before.nonce + i)
          )
          assert.strictEqual(most, 1)
          for (const outcome of yield* treasury.confirmMany(hashes))
            assert.isTrue(Result.isSuccess(outcome) && outcome.success.status === "success")
          assert.strictEqual((yield* onChain(recipients[0]!)).nonce, before.nonce + 6)
        })
    )
  })
})
