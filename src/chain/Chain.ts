import { join } from "node:path"
import { Config, Context, Effect, Layer, Option, Redacted, Schema, Semaphore } from "effect"
import {
  type Address,
  createPublicClient,
  createWalletClient,
  defineChain,
  encodeFunctionData,
  getAddress,
  type Hash,
  type Hex,
  type HttpTransport,
  hexToNumber,
  http,
  type LocalAccount,
  type PublicClient,
  size,
  slice,
  type TypedDataDefinition,
  toHex,
  type Chain as ViemChain,
  type WalletClient
} from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { RouterConfig } from "../RouterConfig.ts"
import { launchAnvil } from "./Anvil.ts"
import { epochAnchorAbi, epochAnchorBytecode, testUsdcAbi, testUsdcBytecode } from "./artifacts.ts"
import { ChainError, fromViemError } from "./ChainError.ts"
import { demoWalletAccounts, routerSignerAccount, treasuryAccount } from "./DevAccounts.ts"
import type { TokenDomain } from "./Eip3009.ts"
import { type EmbeddedContracts, prepareState, readContracts, writeContracts } from "./EmbeddedState.ts"
import { makeOutgoing, type OutgoingCall, type OutgoingTransactions } from "./Outgoing.ts"
import { ensureUptoContracts, PERMIT2_ADDRESS, UPTO_PROXY_ADDRESS } from "./Permit2.ts"
import { permit2Abi } from "./permit2Artifact.ts"
import { nonceBitmapPosition, type UptoPermit, uptoSettleCall } from "./UptoPermit.ts"

export { ChainError, type ChainErrorReason } from "./ChainError.ts"
export {
  randomAuthorizationNonce,
  signTransferAuthorization,
  type TokenDomain,
  type TransferAuthorizationParams,
  transferWithAuthorizationTypes,
  verifyTransferAuthorization
} from "./Eip3009.ts"
export type {
  BroadcastResult,
  GasPlan,
  OutgoingCall,
  OutgoingTransactions,
  SignedTransaction,
  TransactionState
} from "./Outgoing.ts"

/** 10,000 USDC in base units: what every embedded demo wallet starts with. */
export const DEMO_WALLET_FUNDING = 10_000_000_000n

export interface DemoWallet {
  readonly address: Address
  /** Only in embedded mode, where the keys derive from the public dev mnemonic. */
  readonly privateKey?: Hex
}

export interface TransferAuthorization {
  readonly from: Address
  readonly to: Address
  readonly value: bigint
  readonly validAfter: bigint
  readonly validBefore: bigint
  readonly nonce: Hex
  /** 65-byte r‖s‖v from an EOA, or any other length for a contract wallet (ERC-1271). */
  readonly signature: Hex
}

export interface TransactionOutcome {
  readonly status: "success" | "reverted"
  readonly blockNumber: bigint
}

export interface TransferLog {
  readonly from: Address
  readonly to: Address
  readonly value: bigint
  readonly txHash: Hash
  readonly blockNumber: bigint
  readonly logIndex: number
}

export interface ChainShape {
  readonly mode: "embedded" | "external"
  readonly rpcUrl: string
  readonly chainId: number
  readonly network: `eip155:${number}`
  readonly token: Address
  readonly tokenDomain: TokenDomain
  readonly anchor: Address
  /** Permit2 and the x402 upto proxy (canonical addresses; the embedded chain places them, src/chain/Permit2.ts). */
  readonly permit2: Address
  readonly uptoProxy: Address
  readonly treasury: Address
  readonly routerSigner: Address
  /** Sends refunds, payouts and withdrawals: the treasury when its key is configured, else the router signer. */
  readonly payer: Address
  /** The calls the router makes, as data (`ledger/Treasury.ts` signs and sends them exactly once). */
  readonly calls: {
    /** EIP-3009 `transferWithAuthorization`, sent by the router signer (which pays gas). */
    readonly transferWithAuthorization: (authorization: TransferAuthorization) => OutgoingCall
    /**
     * An x402 `upto` settlement: `amount` (at most the ceiling) of the permit through the upto proxy, sent
     * by the router signer (the witness's facilitator), which pays gas.
     */
    readonly uptoSettlement: (permit: UptoPermit, amount: bigint) => OutgoingCall
    /** A token transfer from the payer (`payer`) to `to`. */
    readonly treasuryTransfer: (to: Address, amount: bigint) => OutgoingCall
    /** An epoch root, anchored by the router signer; fails `Invalid` beyond uint64. */
    readonly anchor: (epochId: bigint, root: Hex) => Effect.Effect<OutgoingCall, ChainError>
  }
  /** Estimate, sign locally with a given nonce, broadcast raw bytes, read states and nonces. */
  readonly outgoing: OutgoingTransactions
  readonly demoWallets: ReadonlyArray<DemoWallet>
  readonly publicClient: PublicClient<HttpTransport, ViemChain>
  readonly blockNumber: () => Effect.Effect<bigint, ChainError>
  /** Whether the node answers, within `QUICK_READ_TIMEOUT_MS` (readiness). */
  readonly probe: () => Effect.Effect<void, ChainError>
  /** A quick read (paid path): fails `Timeout` when the node does not answer in time. */
  readonly balanceOf: (address: Address) => Effect.Effect<bigint, ChainError>
  /** A quick read (paid path): fails `Timeout` when the node does not answer in time. */
  readonly authorizationState: (authorizer: Address, nonce: Hex) => Effect.Effect<boolean, ChainError>
  /** A quick read (paid path): whether Permit2 has spent `owner`'s unordered `nonce` (an `upto` settlement). */
  readonly permit2NonceUsed: (owner: Address, nonce: bigint) => Effect.Effect<boolean, ChainError>
  /** A quick read (paid path): the token allowance `owner` gave Permit2. */
  readonly permit2Allowance: (owner: Address) => Effect.Effect<bigint, ChainError>
  /** Dry-runs the authorization as the router would send it (eth_call): fails `Reverted` with the token's reason. */
  readonly simulateTransferWithAuthorization: (
    authorization: TransferAuthorization
  ) => Effect.Effect<void, ChainError>
  readonly waitForReceipt: (hash: Hash) => Effect.Effect<TransactionOutcome, ChainError>
  /** The anchored root of an epoch, or the zero hash when none is anchored. */
  readonly anchoredRoot: (epochId: bigint) => Effect.Effect<Hex, ChainError>
  /** EIP-712 signature by the router signer (receipts); no transaction, no gas. */
  readonly signTypedData: (typedData: TypedDataDefinition) => Effect.Effect<Hex, ChainError>
  /**
   * The router signer's signature over a 32-byte digest (an EIP-712 hash computed elsewhere): the same
   * bytes `signTypedData` gives for the typed data of that digest (RFC 6979, low s), without viem's
   * generic encoding. Receipts are signed this way (`domain/Receipt.ts` `receiptDigest`).
   */
  readonly signDigest: (digest: Hex) => Effect.Effect<Hex, ChainError>
  /** Token Transfer events in an inclusive block range (RPCs cap the range; callers page). */
  readonly readTransferLogs: (range: {
    readonly fromBlock: bigint
    readonly toBlock: bigint
    readonly from?: Address
    readonly to?: Address
  }) => Effect.Effect<ReadonlyArray<TransferLog>, ChainError>
}

const RECEIPT_TIMEOUT_MS = 120_000
const MAX_UINT64 = 2n ** 64n - 1n

const requireUint64 = (epochId: bigint) =>
  epochId >= 0n && epochId <= MAX_UINT64
    ? Effect.void
    : Effect.fail(
        new ChainError({ reason: "Invalid", message: `epoch id ${epochId} does not fit in uint64` })
      )

type SignerWallet = WalletClient<HttpTransport, ViemChain, LocalAccount>

/**
 * One account's sends while a fresh embedded chain is set up (contract deployment, demo-wallet funding),
 * serialized so that nonces never collide. Everything the router sends after start goes through
 * `ledger/Treasury.ts` over `outgoing` (docs/decisions.md D165).
 */
interface Sender {
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
const BACKGROUND_RPC = { timeout: 10_000, retryCount: 3 } as const

interface Connection {
  readonly rpcUrl: string
  readonly chainId: number
  readonly viemChain: ViemChain
  readonly publicClient: PublicClient<HttpTransport, ViemChain>
  /** For quick reads only (`QUICK_READ_TIMEOUT_MS`, no retry). */
  readonly quickClient: PublicClient<HttpTransport, ViemChain>
}

const connect = (rpcUrl: string, chainId: number, pollingInterval: number): Connection => {
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
  return { rpcUrl, chainId, viemChain, publicClient, quickClient }
}

const makeSender = Effect.fnUntraced(function* (connection: Connection, account: LocalAccount) {
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

const call = <A>(operation: string, evaluate: () => Promise<A>) =>
  Effect.tryPromise({ try: evaluate, catch: fromViemError(operation) })

/** A quick read: the transport gives up at the timeout; the bound here also covers everything around it. */
const quickCall = <A>(operation: string, evaluate: () => Promise<A>) =>
  call(operation, evaluate).pipe(
    Effect.timeoutOrElse({
      duration: QUICK_READ_TIMEOUT_MS + 250,
      orElse: () =>
        Effect.fail(
          new ChainError({ reason: "Timeout", message: `${operation}: the node did not answer in time` })
        )
    })
  )

const readTokenDomain = (connection: Connection, token: Address) =>
  Effect.all({
    name: call("Chain.tokenDomain", () =>
      connection.publicClient.readContract({ address: token, abi: testUsdcAbi, functionName: "name" })
    ),
    version: call("Chain.tokenDomain", () =>
      connection.publicClient.readContract({ address: token, abi: testUsdcAbi, functionName: "version" })
    )
  })

// EIP-3009 has a v,r,s entry point on every USDC version and a bytes one only on v2.2+: EOAs use the former.
const splitSignature = (signature: Hex) => {
  if (size(signature) !== 65) return undefined
  const v = hexToNumber(slice(signature, 64, 65))
  return { r: slice(signature, 0, 32), s: slice(signature, 32, 64), v: v < 27 ? v + 27 : v }
}

interface Deployment {
  readonly mode: ChainShape["mode"]
  readonly connection: Connection
  readonly router: Sender
  /** Absent when no treasury key is configured: then the router signer sends refunds and payouts. */
  readonly treasurySender: Sender | undefined
  readonly treasury: Address
  readonly token: Address
  readonly anchor: Address
  readonly demoWallets: ReadonlyArray<DemoWallet>
}

const makeService = Effect.fnUntraced(function* (deployment: Deployment) {
  const { connection, router, token, anchor } = deployment
  const publicClient = connection.publicClient
  const tokenDomain = yield* readTokenDomain(connection, token)
  const payer = deployment.treasurySender ?? router

  const blockNumber = Effect.fn("Chain.blockNumber")(() =>
    call("Chain.blockNumber", () => publicClient.getBlockNumber({ cacheTime: 0 }))
  )

  const probe = Effect.fn("Chain.probe")(() =>
    quickCall("Chain.probe", () => connection.quickClient.getBlockNumber({ cacheTime: 0 })).pipe(
      Effect.asVoid
    )
  )

  const balanceOf = Effect.fn("Chain.balanceOf")((address: Address) =>
    quickCall("Chain.balanceOf", () =>
      connection.quickClient.readContract({
        address: token,
        abi: testUsdcAbi,
        functionName: "balanceOf",
        args: [address]
      })
    )
  )

  const authorizationState = Effect.fn("Chain.authorizationState")((authorizer: Address, nonce: Hex) =>
    quickCall("Chain.authorizationState", () =>
      connection.quickClient.readContract({
        address: token,
        abi: testUsdcAbi,
        functionName: "authorizationState",
        args: [authorizer, nonce]
      })
    )
  )

  const permit2NonceUsed = Effect.fn("Chain.permit2NonceUsed")(function* (owner: Address, nonce: bigint) {
    const { wordPos, bitPos } = nonceBitmapPosition(nonce)
    const word = yield* quickCall("Chain.permit2NonceUsed", () =>
      connection.quickClient.readContract({
        address: PERMIT2_ADDRESS,
        abi: permit2Abi,
        functionName: "nonceBitmap",
        args: [owner, wordPos]
      })
    )
    return ((word >> bitPos) & 1n) === 1n
  })

  const permit2Allowance = Effect.fn("Chain.permit2Allowance")((owner: Address) =>
    quickCall("Chain.permit2Allowance", () =>
      connection.quickClient.readContract({
        address: token,
        abi: testUsdcAbi,
        functionName: "allowance",
        args: [owner, PERMIT2_ADDRESS]
      })
    )
  )

  const simulateTransferWithAuthorization = Effect.fn("Chain.simulateTransferWithAuthorization")(
    (a: TransferAuthorization) => {
      const split = splitSignature(a.signature)
      return call("Chain.simulateTransferWithAuthorization", () =>
        split === undefined
          ? publicClient
              .simulateContract({
                account: router.address,
                address: token,
                abi: testUsdcAbi,
                functionName: "transferWithAuthorization",
                args: [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, a.signature]
              })
              .then(() => undefined)
          : publicClient
              .simulateContract({
                account: router.address,
                address: token,
                abi: testUsdcAbi,
                functionName: "transferWithAuthorization",
                args: [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, split.v, split.r, split.s]
              })
              .then(() => undefined)
      )
    }
  )

  const waitForReceipt = Effect.fn("Chain.waitForReceipt")(function* (hash: Hash) {
    const receipt = yield* call("Chain.waitForReceipt", () =>
      publicClient.waitForTransactionReceipt({ hash, timeout: RECEIPT_TIMEOUT_MS })
    )
    return { status: receipt.status, blockNumber: receipt.blockNumber } satisfies TransactionOutcome
  })

  const calls: ChainShape["calls"] = {
    transferWithAuthorization: (a) => {
      const split = splitSignature(a.signature)
      return {
        from: router.address,
        to: token,
        data:
          split === undefined
            ? encodeFunctionData({
                abi: testUsdcAbi,
                functionName: "transferWithAuthorization",
                args: [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, a.signature]
              })
            : encodeFunctionData({
                abi: testUsdcAbi,
                functionName: "transferWithAuthorization",
                args: [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, split.v, split.r, split.s]
              })
      }
    },
    uptoSettlement: (permit, amount) => {
      const settle = uptoSettleCall(permit, amount)
      return {
        from: router.address,
        to: settle.address,
        data: encodeFunctionData({ abi: settle.abi, functionName: settle.functionName, args: settle.args })
      }
    },
    treasuryTransfer: (to, amount) => ({
      from: payer.address,
      to: token,
      data: encodeFunctionData({ abi: testUsdcAbi, functionName: "transfer", args: [to, amount] })
    }),
    anchor: (epochId, root) =>
      Effect.map(requireUint64(epochId), () => ({
        from: router.address,
        to: anchor,
        data: encodeFunctionData({ abi: epochAnchorAbi, functionName: "anchor", args: [epochId, root] })
      }))
  }
  const outgoing = makeOutgoing(
    publicClient,
    connection.chainId,
    [router.account, payer.account].filter((account, i, all) => all.indexOf(account) === i)
  )

  const anchoredRoot = Effect.fn("Chain.anchoredRoot")(function* (epochId: bigint) {
    yield* requireUint64(epochId)
    return yield* call("Chain.anchoredRoot", () =>
      publicClient.readContract({
        address: anchor,
        abi: epochAnchorAbi,
        functionName: "roots",
        args: [epochId]
      })
    )
  })

  const readTransferLogs = Effect.fn("Chain.readTransferLogs")(function* (range: {
    readonly fromBlock: bigint
    readonly toBlock: bigint
    readonly from?: Address
    readonly to?: Address
  }) {
    const logs = yield* call("Chain.readTransferLogs", () =>
      publicClient.getContractEvents({
        address: token,
        abi: testUsdcAbi,
        eventName: "Transfer",
        args: { from: range.from, to: range.to },
        fromBlock: range.fromBlock,
        toBlock: range.toBlock,
        strict: true
      })
    )
    return logs.flatMap(
      (log): Array<TransferLog> =>
        log.transactionHash === null || log.blockNumber === null || log.logIndex === null
          ? []
          : [
              {
                from: log.args.from,
                to: log.args.to,
                value: log.args.value,
                txHash: log.transactionHash,
                blockNumber: log.blockNumber,
                logIndex: log.logIndex
              }
            ]
    )
  })

  return {
    mode: deployment.mode,
    rpcUrl: connection.rpcUrl,
    chainId: connection.chainId,
    network: `eip155:${connection.chainId}`,
    token,
    tokenDomain,
    anchor,
    permit2: PERMIT2_ADDRESS,
    uptoProxy: UPTO_PROXY_ADDRESS,
    treasury: deployment.treasury,
    routerSigner: router.address,
    payer: payer.address,
    calls,
    outgoing,
    demoWallets: deployment.demoWallets,
    publicClient,
    blockNumber,
    probe,
    balanceOf,
    authorizationState,
    permit2NonceUsed,
    permit2Allowance,
    simulateTransferWithAuthorization,
    waitForReceipt,
    anchoredRoot,
    signTypedData: (typedData: TypedDataDefinition) =>
      call("Chain.signTypedData", () => router.account.signTypedData(typedData)),
    signDigest: (digest: Hex) =>
      call("Chain.signDigest", () => {
        const sign = router.account.sign
        if (sign === undefined) throw new Error("the router signer cannot sign a digest")
        return sign({ hash: digest })
      }),
    readTransferLogs
  } satisfies ChainShape
})

const deployContract = Effect.fnUntraced(function* (
  connection: Connection,
  deployer: Sender,
  name: string,
  write: (wallet: SignerWallet, nonce: number) => Promise<Hash>
) {
  const hash = yield* deployer.send(`deploy ${name}`, write)
  const receipt = yield* call(`deploy ${name}`, () =>
    connection.publicClient.waitForTransactionReceipt({ hash })
  )
  if (receipt.status !== "success" || !receipt.contractAddress) {
    return yield* new ChainError({ reason: "Devnet", message: `deploying ${name} failed` })
  }
  return getAddress(receipt.contractAddress)
})

/** A fresh chain: the contracts deployed, the demo wallets funded. */
const deployFresh = Effect.fnUntraced(function* (connection: Connection, router: Sender) {
  const token = yield* deployContract(connection, router, "TestUSDC", (wallet, nonce) =>
    wallet.deployContract({ abi: testUsdcAbi, bytecode: testUsdcBytecode, nonce })
  )
  const anchor = yield* deployContract(connection, router, "EpochAnchor", (wallet, nonce) =>
    wallet.deployContract({ abi: epochAnchorAbi, bytecode: epochAnchorBytecode, nonce })
  )
  const mints = yield* Effect.forEach(demoWalletAccounts(), (wallet) =>
    router.send("mint", (client, nonce) =>
      client.writeContract({
        address: token,
        abi: testUsdcAbi,
        functionName: "mint",
        args: [wallet.address, DEMO_WALLET_FUNDING],
        nonce
      })
    )
  )
  yield* Effect.forEach(
    mints,
    (hash) => call("mint", () => connection.publicClient.waitForTransactionReceipt({ hash })),
    {
      concurrency: "unbounded",
      discard: true
    }
  )
  return { chainId: connection.chainId, token, anchor } satisfies EmbeddedContracts
})

/** Whether the recorded contracts are on this chain (a chain whose state was lost has none). */
const isDeployed = (connection: Connection, contracts: EmbeddedContracts) =>
  Effect.forEach([contracts.token, contracts.anchor], (address) =>
    call("Chain.getCode", () => connection.publicClient.getCode({ address: getAddress(address) }))
  ).pipe(
    Effect.map(
      (codes) => contracts.chainId === connection.chainId && codes.every((code) => (code?.length ?? 0) > 2)
    )
  )

/**
 * No RPC_URL: a private Anvil with the project's contracts and funded demo wallets. With `stateDir`
 * the chain persists there across restarts (contracts deployed once, on a fresh chain); without it,
 * it lives as long as the layer.
 */
const embedded = Effect.fnUntraced(function* (stateDir: string | undefined) {
  const state = stateDir === undefined ? undefined : yield* prepareState(stateDir)
  const anvil = yield* launchAnvil({ state })
  const connection = connect(anvil.rpcUrl, anvil.chainId, 50)
  // Permit2 and the upto proxy at their canonical addresses (idempotent: a resumed chain has them).
  yield* ensureUptoContracts(connection)
  const router = yield* makeSender(connection, routerSignerAccount())
  const treasurySender = yield* makeSender(connection, treasuryAccount())
  const recorded = stateDir === undefined ? undefined : yield* readContracts(stateDir)
  const reused = recorded !== undefined && (yield* isDeployed(connection, recorded))
  if (recorded !== undefined && !reused) {
    yield* Effect.logError(
      "the embedded chain lost its state: deploying fresh contracts; ledger entries of earlier runs no longer match the chain"
    )
  }
  const contracts = reused ? recorded : yield* deployFresh(connection, router)
  if (stateDir !== undefined && !reused) yield* writeContracts(stateDir, contracts)
  // A resumed chain may miss its last seconds (docs/decisions.md D80): the treasury's recovery pass at
  // start (ledger/Treasury.ts, D168) offers again every transaction it recorded that this chain does not know.
  const token = getAddress(contracts.token)
  const anchor = getAddress(contracts.anchor)
  const demoWallets = demoWalletAccounts()
  yield* Effect.logInfo(reused ? "embedded chain resumed" : "embedded chain ready").pipe(
    Effect.annotateLogs({ rpcUrl: anvil.rpcUrl, token, anchor, demoWallets: demoWallets.length })
  )
  return yield* makeService({
    mode: "embedded",
    connection,
    router,
    treasurySender,
    treasury: treasurySender.address,
    token,
    anchor,
    demoWallets: demoWallets.map((account) => {
      const key = account.getHdKey().privateKey
      return key === null
        ? { address: account.address }
        : { address: account.address, privateKey: toHex(key) }
    })
  })
})

const AddressConfig = (name: string) =>
  Config.schema(Schema.String.check(Schema.isPattern(/^0x[0-9a-fA-F]{40}$/)), name).pipe(
    Config.map((address) => getAddress(address.toLowerCase()))
  )

const isPrivateKey = (value: string): value is Hex => /^0x[0-9a-fA-F]{64}$/.test(value)

const accountFromKey = (name: string, key: Redacted.Redacted<string>) => {
  const raw = Redacted.value(key).trim()
  const hex = raw.startsWith("0x") ? raw : `0x${raw}`
  return isPrivateKey(hex)
    ? Effect.succeed(privateKeyToAccount(hex))
    : Effect.fail(new ChainError({ reason: "Config", message: `${name} is not a 32-byte hex private key` }))
}

/** RPC_URL set: the configured chain, token and anchor; the router key signs and pays gas. */
const external = Effect.fnUntraced(function* (rpcUrl: string) {
  const config = yield* Config.all({
    routerKey: Config.Redacted("ROUTER_PRIVATE_KEY"),
    treasuryKey: Config.option(Config.Redacted("TREASURY_PRIVATE_KEY")),
    treasury: AddressConfig("TREASURY_ADDRESS"),
    token: AddressConfig("TOKEN_ADDRESS"),
    anchor: AddressConfig("ANCHOR_ADDRESS"),
    chainId: Config.Int("CHAIN_ID")
  })
  const connection = connect(rpcUrl, config.chainId, 1000)
  const actualChainId = yield* call("Chain.connect", () => connection.publicClient.getChainId())
  if (actualChainId !== config.chainId) {
    return yield* new ChainError({
      reason: "Config",
      message: `CHAIN_ID is ${config.chainId} but the RPC serves chain ${actualChainId}`
    })
  }
  const router = yield* makeSender(connection, yield* accountFromKey("ROUTER_PRIVATE_KEY", config.routerKey))
  const treasuryKey = Option.getOrUndefined(config.treasuryKey)
  let treasurySender: Sender | undefined
  if (treasuryKey !== undefined) {
    const account = yield* accountFromKey("TREASURY_PRIVATE_KEY", treasuryKey)
    if (account.address !== config.treasury) {
      return yield* new ChainError({
        reason: "Config",
        message: "TREASURY_PRIVATE_KEY does not belong to TREASURY_ADDRESS"
      })
    }
    // One account, one nonce sequence: a treasury that is also the router signer shares its sender.
    treasurySender = account.address === router.address ? router : yield* makeSender(connection, account)
  }
  const anchorOwner = yield* call("Chain.connect", () =>
    connection.publicClient.readContract({
      address: config.anchor,
      abi: epochAnchorAbi,
      functionName: "owner"
    })
  )
  if (anchorOwner !== router.address) {
    return yield* new ChainError({
      reason: "Config",
      message: `ANCHOR_ADDRESS is owned by ${anchorOwner}, not by the router signer ${router.address}`
    })
  }
  return yield* makeService({
    mode: "external",
    connection,
    router,
    treasurySender,
    treasury: config.treasury,
    token: config.token,
    anchor: config.anchor,
    demoWallets: []
  })
})

const make = Effect.fnUntraced(function* (stateDir: string | undefined) {
  const rpcUrl = yield* Config.option(Config.String("RPC_URL"))
  const configured = Option.getOrUndefined(rpcUrl)?.trim()
  return configured === undefined || configured === ""
    ? yield* embedded(stateDir)
    : yield* external(configured)
})

/**
 * The settlement chain: the stablecoin, the epoch anchor, and the accounts that use them.
 * Embedded (no RPC_URL) starts and seeds a private Anvil; external uses the configured RPC and contracts.
 */
export class Chain extends Context.Service<Chain, ChainShape>()("router/chain/Chain") {
  /** The embedded chain lives as long as the layer (tests). */
  static readonly layer = Layer.effect(Chain, make(undefined))
  /** The embedded chain persists in `DATA_DIR/chain` across restarts (`npm start`). */
  static readonly layerDurable = Layer.effect(
    Chain,
    Effect.flatMap(RouterConfig, (config) => make(join(config.dataDir, "chain")))
  )
}
