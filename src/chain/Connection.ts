import { Effect, type Redacted, Semaphore } from "effect"
import {
  type Address,
  createPublicClient,
  createWalletClient,
  defineChain,
  type Hash,
  type Hex,
  type HttpTransport,
  hexToNumber,
  http,
  type LocalAccount,
  type PublicClient,
  size,
  slice,
  type Chain as ViemChain,
  type WalletClient
} from "viem"
import { testUsdcAbi } from "./artifacts.ts"
import { ChainError, fromViemError } from "./ChainError.ts"
import { httpPost, type JsonRpcBatch, makeJsonRpcBatch } from "./JsonRpc.ts"
import { makeQuickReads, type QuickReads } from "./QuickReads.ts"

/**
 * How the router reaches a chain: the viem clients (quick reads bounded, background calls retried), a
 * local signer account with its nonce semaphore, and the read helpers the Chain service is built from.
 */

export const DEMO_WALLET_FUNDING = 10_000_000_000n

export interface DemoWallet {
  readonly address: Address
  /** Only in embedded mode, where the keys derive from the public dev mnemonic. */
  readonly privateKey?: Hex
}

export const RECEIPT_TIMEOUT_MS = 120_000
export const MAX_UINT64 = 2n ** 64n - 1n

export const requireUint64 = (epochId: bigint) =>
  epochId >= 0n && epochId <= MAX_UINT64
    ? Effect.void
    : Effect.fail(
        new ChainError({ reason: "Invalid", message: `epoch id ${epochId} does not fit in uint64` })
      )

export type SignerWallet = WalletClient<HttpTransport, ViemChain, LocalAccount>

/**
 * One account's sends while a fresh embedded chain is set up (contract deployment, demo-wallet funding),
 * serialized so that nonces never collide. Everything the router sends after start goes through
 * `ledger/Treasury.ts` over `outgoing` (docs/decisions.md D165).
 */
export interface Sender {
  readonly address: Address
  readonly account: LocalAccount
  readonly send: (
    operation: string,
    write: (wallet: SignerWallet, nonce: number) => Promise<Hash>
  ) => Effect.Effect<Hash, ChainError>
}

/**
 * A read a paid request waits on (x402 verification) or a readiness probe: one attempt, answered or given
 * up within this, so a stalled node costs a caller 2 s, not viem's 4 × 10 s (docs/decisions.md D79).
 */
export const QUICK_READ_TIMEOUT_MS = 2_000
/** Everything else (settlement, refunds, payouts, anchors, reconciliation): longer, and retried. */
export const BACKGROUND_RPC = { timeout: 10_000, retryCount: 3 } as const

export interface Connection {
  readonly rpcUrl: string
  readonly chainId: number
  readonly viemChain: ViemChain
  readonly publicClient: PublicClient<HttpTransport, ViemChain>
  /** For quick reads only (`QUICK_READ_TIMEOUT_MS`, no retry). */
  readonly quickClient: PublicClient<HttpTransport, ViemChain>
  /** The paid path's contract reads, batched per event-loop turn (`QUICK_READ_TIMEOUT_MS`, no retry). */
  readonly quickReads: QuickReads
  /**
   * The settlement's transactions (`Outgoing.ts`): light JSON-RPC batched per event-loop turn, each
   * request bounded and retried as `BACKGROUND_RPC` (D485), on connections of their own.
   */
  readonly backgroundRpc: JsonRpcBatch
}

export const connect = (rpcUrl: string, chainId: number, pollingInterval: number): Connection => {
  const viemChain = defineChain({
    id: chainId,
    name: `eip155:${chainId}`,
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [rpcUrl] } }
  })
  const publicClient = createPublicClient({
    chain: viemChain,
    transport: http(rpcUrl, BACKGROUND_RPC),
    pollingInterval
  })
  const quickClient = createPublicClient({
    chain: viemChain,
    transport: http(rpcUrl, { timeout: QUICK_READ_TIMEOUT_MS, retryCount: 0 })
  })
  const quickReads = makeQuickReads(httpPost(rpcUrl, QUICK_READ_TIMEOUT_MS))
  const backgroundRpc = makeJsonRpcBatch(httpPost(rpcUrl, BACKGROUND_RPC.timeout), {
    retries: BACKGROUND_RPC.retryCount
  })
  return { rpcUrl, chainId, viemChain, publicClient, quickClient, quickReads, backgroundRpc }
}

export const makeSender = Effect.fnUntraced(function* (connection: Connection, account: LocalAccount) {
  const wallet = createWalletClient({
    account,
    chain: connection.viemChain,
    transport: http(connection.rpcUrl)
  })
  const semaphore = yield* Semaphore.make(1)
  // The node's pending count each time: the treasury (ledger/Treasury.ts) allocates this account's nonces
  // too, so no count is cached here.
  const send: Sender["send"] = (operation, write) =>
    semaphore.withPermit(
      Effect.gen(function* () {
        const nonce = yield* Effect.tryPromise({
          try: () =>
            connection.publicClient.getTransactionCount({ address: account.address, blockTag: "pending" }),
          catch: fromViemError(operation)
        })
        return yield* Effect.tryPromise({
          try: () => write(wallet, nonce),
          catch: fromViemError(operation)
        })
      })
    )
  return { address: account.address, account, send } satisfies Sender
})

export const call = <A>(operation: string, evaluate: () => Promise<A>) =>
  Effect.tryPromise({ try: evaluate, catch: fromViemError(operation) })

/** A quick read: the transport gives up at the timeout; the bound here also covers everything around it. */
export const quickCall = <A>(operation: string, read: Effect.Effect<A, ChainError>) =>
  read.pipe(
    Effect.timeoutOrElse({
      duration: QUICK_READ_TIMEOUT_MS + 250,
      orElse: () =>
        Effect.fail(
          new ChainError({ reason: "Timeout", message: `${operation}: the node did not answer in time` })
        )
    })
  )

export const readTokenDomain = (connection: Connection, token: Address) =>
  Effect.all({
    name: call("Chain.tokenDomain", () =>
      connection.publicClient.readContract({ address: token, abi: testUsdcAbi, functionName: "name" })
    ),
    version: call("Chain.tokenDomain", () =>
      connection.publicClient.readContract({ address: token, abi: testUsdcAbi, functionName: "version" })
    )
  })

// EIP-3009 has a v,r,s entry point on every USDC version and a bytes one only on v2.2+: EOAs use the former.
export const splitSignature = (signature: Hex) => {
  if (size(signature) !== 65) return undefined
  const v = hexToNumber(slice(signature, 64, 65))
  return { r: slice(signature, 0, 32), s: slice(signature, 32, 64), v: v < 27 ? v + 27 : v }
}

export interface Deployment {
  readonly mode: "embedded" | "external"
  readonly connection: Connection
  readonly router: Sender
  /** The router signer's private key, for `Chain.signDigest` (receipts, signed in WebAssembly). */
  readonly routerKey: Redacted.Redacted<Hex>
  /** Absent when no treasury key is configured: then the router signer sends refunds and payouts. */
  readonly treasurySender: Sender | undefined
  /** The treasury sender's private key (absent with it), for signing its transactions in WebAssembly. */
  readonly treasuryKey: Redacted.Redacted<Hex> | undefined
  readonly treasury: Address
  readonly token: Address
  readonly anchor: Address
  readonly demoWallets: ReadonlyArray<DemoWallet>
}
