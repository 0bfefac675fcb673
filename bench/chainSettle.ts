/**
 * `npm run bench:chain-settle`: the main-thread CPU and the HTTP requests of a settlement's chain traffic
 * (issue 12, D485–D489), timed in process with `process.cpuUsage` against the embedded Anvil (a block per
 * transaction). Each settlement is what the treasury does for an x402 authorization: plan (gas estimate
 * and fee estimate), sign, broadcast, and look at the hash every 25 ms until it is mined; `BENCH_TRANSFERS` of them
 * per round, `CHAIN_CALLS_AT_ONCE` at a time as the treasury estimates and broadcasts a pass's transfers (`BENCH_AT_ONCE` to change it).
 *
 * Two paths, in interleaved rounds (A B A B …, a warm-up pair first): `viem`, the way `Outgoing.ts` went
 * before D485 (viem's public client over its http transport, `estimateGas`, `estimateFeesPerGas`,
 * `sendRawTransaction`, `getTransactionReceipt` / `getTransaction`; the local account's `signTransaction`,
 * noble's secp256k1 and keccak), and `light`, the router's `Outgoing` now (batched JSON-RPC over node:http,
 * the transaction signed in WebAssembly). The authorizations are signed before a round is timed. Prints,
 * per path: CPU µs per settlement (median and best round; the kernel's share, mostly socket writes), HTTP requests and JSON-RPC calls per
 * settlement, and the signature alone (µs, best of rounds). `BENCH_PROFILE=<dir>` writes a CPU profile of
 * each timed `light` round there. Asserts nothing.
 */
import { writeFileSync } from "node:fs"
import { Session } from "node:inspector"
import { join } from "node:path"
import { ConfigProvider, Context, Effect, Layer, Redacted } from "effect"
import { type Hash, type Hex, keccak256 } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import {
  type BroadcastResult,
  Chain,
  type ChainShape,
  type GasPlan,
  type OutgoingCall,
  randomAuthorizationNonce,
  signTransferAuthorization
} from "../src/chain/Chain.ts"
import { BACKGROUND_RPC } from "../src/chain/Connection.ts"
import { privateKeyOf, routerSignerAccount } from "../src/chain/DevAccounts.ts"
import { httpPost, makeJsonRpcBatch, type PostJson } from "../src/chain/JsonRpc.ts"
import { FEE_ESTIMATE_TTL_MS, makeOutgoing, type OutgoingTransactions } from "../src/chain/Outgoing.ts"
import { signEip1559 } from "../src/chain/TransactionSigning.ts"
import { keccakReady } from "../src/domain/Keccak.ts"
import { CHAIN_CALLS_AT_ONCE } from "../src/ledger/Treasury.ts"
import { median } from "./support/Stats.ts"

const TRANSFERS = Number(process.env.BENCH_TRANSFERS ?? 200)
/** A directory: the `light` rounds are CPU-profiled there (one `.cpuprofile` a round). */
const PROFILE_DIR = process.env.BENCH_PROFILE

/** The in-process V8 profiler (node:inspector), for the rounds of one path only. */
const profiler = (() => {
  const session = new Session()
  const post = (method: string, params?: object) =>
    new Promise<unknown>((resolve, reject) =>
      session.post(method, params, (error, result) => (error ? reject(error) : resolve(result)))
    )
  return {
    start: async () => {
      session.connect()
      await post("Profiler.enable")
      await post("Profiler.start")
    },
    stop: async (file: string) => {
      const { profile } = (await post("Profiler.stop")) as { profile: unknown }
      writeFileSync(file, JSON.stringify(profile))
      session.disconnect()
    }
  }
})()
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4)
/** Between a broadcast and the first look at its hash, and between looks. */
const LOOK_MS = 25

/** Settlements under way at once: the treasury's `CHAIN_CALLS_AT_ONCE` unless set. */
const AT_ONCE = Number(process.env.BENCH_AT_ONCE ?? CHAIN_CALLS_AT_ONCE)

interface Counts {
  requests: number
  calls: number
}

/** The old path: viem's client and local account, as `Outgoing.ts` used them before D485. */
const viemPath = (chain: ChainShape) => {
  const client = chain.publicClient
  const account = routerSignerAccount()
  // The same 1.5 s fee cache (D330).
  let cached:
    | { at: number; fees: Promise<{ maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }> }
    | undefined
  const fees = () => {
    const now = Date.now()
    if (cached === undefined || now - cached.at >= FEE_ESTIMATE_TTL_MS) {
      cached = { at: now, fees: client.estimateFeesPerGas({ type: "eip1559" }) }
    }
    return cached.fees
  }
  const plan = (call: OutgoingCall) =>
    Effect.promise(async () => {
      const [gas, estimate] = await Promise.all([
        client.estimateGas({ account: call.from, to: call.to, data: call.data }),
        fees()
      ])
      return {
        gas: (gas * 125n) / 100n,
        maxFeePerGas: estimate.maxFeePerGas * 2n,
        maxPriorityFeePerGas: estimate.maxPriorityFeePerGas
      } satisfies GasPlan
    })
  const sign = (call: OutgoingCall, gasPlan: GasPlan, nonce: number) =>
    Effect.promise(async () => {
      const raw = await account.signTransaction({
        type: "eip1559",
        chainId: chain.chainId,
        to: call.to,
        data: call.data,
        value: 0n,
        nonce,
        ...gasPlan
      })
      return { raw, hash: keccak256(raw) }
    })
  const broadcast = (raw: Hex) =>
    Effect.promise(() => client.sendRawTransaction({ serializedTransaction: raw })).pipe(
      Effect.as<BroadcastResult>("accepted")
    )
  const mined = (hash: Hash) =>
    Effect.promise(async () => {
      const receipt = await client.getTransactionReceipt({ hash }).catch(() => undefined)
      if (receipt !== undefined) return true
      await client.getTransaction({ hash }).catch(() => undefined)
      return false
    })
  return { plan, sign, broadcast, mined }
}

/** The router's path now: `Outgoing` over its own batched JSON-RPC, its POSTs counted. */
const lightPath = (chain: ChainShape, counts: Counts) => {
  const post = httpPost(chain.rpcUrl, BACKGROUND_RPC.timeout)
  const counted: PostJson = (body) => {
    counts.requests++
    counts.calls += (body.match(/"method"/g) ?? []).length
    return post(body)
  }
  const outgoing: OutgoingTransactions = makeOutgoing(
    makeJsonRpcBatch(counted, { retries: BACKGROUND_RPC.retryCount }),
    chain.chainId,
    [Redacted.make(privateKeyOf(routerSignerAccount()))]
  )
  return {
    plan: outgoing.plan,
    sign: outgoing.sign,
    broadcast: outgoing.broadcast,
    mined: (hash: Hash) => Effect.map(outgoing.state(hash), (state) => state._tag === "Mined")
  }
}

type Path = ReturnType<typeof lightPath>

/** Authorizations of the demo wallets to the treasury, signed now (outside the timed window). */
const authorizations = (chain: ChainShape, count: number) =>
  Effect.forEach(
    Array.from({ length: count }, (_, i) => i),
    (i) =>
      Effect.promise(async () => {
        const account = privateKeyToAccount(chain.demoWallets[i % chain.demoWallets.length]!.privateKey!)
        const params = {
          token: chain.token,
          chainId: chain.chainId,
          domain: chain.tokenDomain,
          to: chain.treasury,
          value: 1n,
          validAfter: 0n,
          validBefore: BigInt(Math.floor(Date.now() / 1000) + 3600),
          nonce: randomAuthorizationNonce()
        }
        const signature = await signTransferAuthorization(account, params)
        return chain.calls.transferWithAuthorization({ ...params, from: account.address, signature })
      }),
    { concurrency: 16 }
  )

/** One round: every call settled, `AT_ONCE` at a time; the CPU it took (user and kernel µs). */
const round = (chain: ChainShape, path: Path, calls: ReadonlyArray<OutgoingCall>) =>
  Effect.gen(function* () {
    const base = yield* chain.outgoing.minedNonce(chain.routerSigner)
    const start = process.cpuUsage()
    yield* Effect.forEach(
      calls,
      (call, i) =>
        Effect.gen(function* () {
          const plan = yield* path.plan(call)
          const signed = yield* path.sign(call, plan, base + i)
          yield* path.broadcast(signed.raw)
          // A look per LOOK_MS, as a confirm looks once per block: both paths then look about once (a
          // faster path polling a not-yet-mined hash more often would pay for its speed).
          do yield* Effect.sleep(LOOK_MS)
          while (!(yield* path.mined(signed.hash)))
        }),
      { concurrency: AT_ONCE, discard: true }
    )
    const used = process.cpuUsage(start)
    return used
  })

/** The signature alone, µs each, best of rounds: viem's local account against the WebAssembly one. */
const signatureCost = async () => {
  await keccakReady
  const key = privateKeyOf(routerSignerAccount())
  const account = privateKeyToAccount(key)
  const keyBytes = Buffer.from(key.slice(2), "hex")
  const tx = (nonce: number) => ({
    chainId: 31337,
    nonce,
    to: routerSignerAccount().address,
    data: `0xe3ee160e${"ab".repeat(288)}` as Hex,
    gas: 90_000n,
    maxFeePerGas: 2_000_000_000n,
    maxPriorityFeePerGas: 1_000_000_000n
  })
  const best = { viem: Number.POSITIVE_INFINITY, wasm: Number.POSITIVE_INFINITY }
  for (let r = 0; r <= ROUNDS; r++) {
    let start = process.cpuUsage()
    for (let i = 0; i < 500; i++)
      keccak256(await account.signTransaction({ type: "eip1559", value: 0n, ...tx(i) }))
    let used = process.cpuUsage(start)
    if (r > 0) best.viem = Math.min(best.viem, (used.user + used.system) / 500)
    start = process.cpuUsage()
    for (let i = 0; i < 500; i++) signEip1559(tx(i), keyBytes)
    used = process.cpuUsage(start)
    if (r > 0) best.wasm = Math.min(best.wasm, (used.user + used.system) / 500)
  }
  return best
}

const main = Effect.gen(function* () {
  const context = yield* Layer.build(
    Chain.layer.pipe(Layer.provide(ConfigProvider.layer(ConfigProvider.fromEnvRecord({}))))
  )
  const chain = Context.get(context, Chain)
  // viem's transport goes through fetch: its requests and calls counted from the bodies it POSTs.
  const viemCounts: Counts = { requests: 0, calls: 0 }
  const realFetch = globalThis.fetch
  globalThis.fetch = (input, init) => {
    if (typeof init?.body === "string") {
      viemCounts.requests++
      viemCounts.calls += (init.body.match(/"method"/g) ?? []).length
    }
    return realFetch(input, init)
  }
  const lightCounts: Counts = { requests: 0, calls: 0 }
  const paths = { viem: viemPath(chain), light: lightPath(chain, lightCounts) }
  const counts = { viem: viemCounts, light: lightCounts }
  const cpu: Record<keyof typeof paths, Array<number>> = { viem: [], light: [] }
  const system: Record<keyof typeof paths, Array<number>> = { viem: [], light: [] }
  const sent: Record<keyof typeof paths, Counts> = {
    viem: { requests: 0, calls: 0 },
    light: { requests: 0, calls: 0 }
  }
  for (let r = 0; r <= ROUNDS; r++) {
    for (const name of r % 2 === 0 ? (["viem", "light"] as const) : (["light", "viem"] as const)) {
      const calls = yield* authorizations(chain, TRANSFERS)
      const before = { ...counts[name] }
      const profiled = r > 0 && name === "light" && PROFILE_DIR !== undefined
      if (profiled) yield* Effect.promise(() => profiler.start())
      const used = yield* round(chain, paths[name], calls)
      if (profiled) yield* Effect.promise(() => profiler.stop(join(PROFILE_DIR, `light-${r}.cpuprofile`)))
      if (r === 0) continue
      cpu[name].push((used.user + used.system) / TRANSFERS)
      system[name].push(used.system / TRANSFERS)
      sent[name].requests += counts[name].requests - before.requests
      sent[name].calls += counts[name].calls - before.calls
    }
  }
  globalThis.fetch = realFetch
  const signing = yield* Effect.promise(signatureCost)
  const settled = TRANSFERS * ROUNDS
  console.log(
    `${TRANSFERS} settlements a round, ${ROUNDS} rounds a path (interleaved, after a warm-up pair), ${AT_ONCE} at a time`
  )
  for (const name of ["viem", "light"] as const) {
    console.log(
      `${name.padEnd(5)}  CPU µs/settlement median ${median(cpu[name]).toFixed(0)}, best ${Math.min(...cpu[name]).toFixed(0)}` +
        ` (kernel, median ${median(system[name]).toFixed(0)})` +
        `  HTTP requests/settlement ${(sent[name].requests / settled).toFixed(2)}` +
        `  JSON-RPC calls/settlement ${(sent[name].calls / settled).toFixed(2)}` +
        `  rounds ${cpu[name].map((v) => v.toFixed(0)).join(" ")}`
    )
  }
  console.log(
    `signature alone: viem ${signing.viem.toFixed(0)} µs, WebAssembly ${signing.wasm.toFixed(0)} µs`
  )
})

Effect.runPromise(Effect.scoped(main)).then(
  () => process.exit(0),
  (error) => {
    console.error(error)
    process.exit(1)
  }
)
