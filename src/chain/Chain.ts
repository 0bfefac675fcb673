import { join } from "node:path"
import { Config, Context, Effect, Layer, Option, Redacted, Schema } from "effect"
import {
  type Address,
  encodeFunctionData,
  type Hash,
  type Hex,
  type HttpTransport,
  type PublicClient,
  type TypedDataDefinition,
  type Chain as ViemChain
} from "viem"
import { RouterConfig } from "../RouterConfig.ts"
import { traced } from "../Telemetry.ts"
import { type AuthorizationFate, readAuthorizationFate } from "./AuthorizationFate.ts"
import { epochAnchorAbi, testUsdcAbi } from "./artifacts.ts"
import { type ChainError, fromViemError } from "./ChainError.ts"
import {
  call,
  type DemoWallet,
  type Deployment,
  quickCall,
  RECEIPT_TIMEOUT_MS,
  readTokenDomain,
  requireUint64,
  splitSignature
} from "./Connection.ts"
import { embedded, external } from "./Deployment.ts"
import type { TokenDomain } from "./Eip3009.ts"
import type { EmbeddedMining } from "./Mining.ts"
import { makeOutgoing, type OutgoingCall, type OutgoingTransactions } from "./Outgoing.ts"
import { PERMIT2_ADDRESS, UPTO_PROXY_ADDRESS } from "./Permit2.ts"
import { readCalldata } from "./QuickReads.ts"
import { secp256k1Backend, signDigestBytes } from "./Secp256k1.ts"
import { nonceBitmapPosition, type UptoPermit, uptoSettleCall } from "./UptoPermit.ts"

export type { AuthorizationFate } from "./AuthorizationFate.ts"
export { ChainError, type ChainErrorReason } from "./ChainError.ts"
export { DEMO_WALLET_FUNDING, type DemoWallet, QUICK_READ_TIMEOUT_MS } from "./Connection.ts"
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
  /** The newest block's timestamp (seconds): the chain's own time, which validity windows are judged by. */
  readonly headTimestamp: () => Effect.Effect<bigint, ChainError>
  /** Whether the node answers, within `QUICK_READ_TIMEOUT_MS` (readiness). */
  readonly probe: () => Effect.Effect<void, ChainError>
  /** A quick read (paid path): fails `Timeout` when the node does not answer in time. */
  readonly balanceOf: (address: Address) => Effect.Effect<bigint, ChainError>
  /** A quick read (paid path): fails `Timeout` when the node does not answer in time. */
  readonly authorizationState: (authorizer: Address, nonce: Hex) => Effect.Effect<boolean, ChainError>
  /**
   * What spent an EIP-3009 nonce (D533): the token's `AuthorizationUsed` (with the transfer beside it) or
   * `AuthorizationCanceled` event, read forward page by page from `sinceSeconds`; `undefined` when none is
   * found (or its receipt disagrees).
   */
  readonly authorizationFate: (
    authorizer: Address,
    nonce: Hex,
    sinceSeconds: bigint
  ) => Effect.Effect<AuthorizationFate | undefined, ChainError>
  /** A quick read (paid path): whether Permit2 has spent `owner`'s unordered `nonce` (an `upto` settlement). */
  readonly permit2NonceUsed: (owner: Address, nonce: bigint) => Effect.Effect<boolean, ChainError>
  /** A quick read (paid path): the token allowance `owner` gave Permit2. */
  readonly permit2Allowance: (owner: Address) => Effect.Effect<bigint, ChainError>
  /**
   * Sends the quick reads asked for so far now, not at the end of the event-loop turn (`QuickReads.send`):
   * for a caller about to do CPU work while they are in flight.
   */
  readonly sendQuickReads: Effect.Effect<void>
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
   * generic encoding, by libsecp256k1 in WebAssembly (`Secp256k1.ts`, ~0.17 ms where viem's noble took
   * 0.56-1.2 ms). Receipts are signed this way (`domain/Receipt.ts` `receiptDigest`).
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

const makeService = Effect.fnUntraced(function* (deployment: Deployment) {
  const { connection, router, token, anchor } = deployment
  const publicClient = connection.publicClient
  const tokenDomain = yield* readTokenDomain(connection, token)
  const payer = deployment.treasurySender ?? router
  // Signs digests in WebAssembly (`signDigest`, D432): read out of its `Redacted` once, never logged.
  const routerKeyBytes = Buffer.from(Redacted.value(deployment.routerKey).slice(2), "hex")

  const headTimestamp = Effect.fn("Chain.headTimestamp")(() =>
    call("Chain.headTimestamp", () => publicClient.getBlock({ blockTag: "latest" })).pipe(
      Effect.map((block) => block.timestamp)
    )
  )

  const probe = Effect.fn("Chain.probe")(() =>
    quickCall(
      "Chain.probe",
      call("Chain.probe", () => connection.quickClient.getBlockNumber({ cacheTime: 0 }))
    ).pipe(Effect.asVoid)
  )

  // The quick reads are on every x402 call's path: traced without `Effect.fn` (D360).
  const reads = connection.quickReads

  const balanceOf = (address: Address) =>
    quickCall(
      "Chain.balanceOf",
      reads.uint("Chain.balanceOf", token, () => readCalldata.balanceOf(address))
    ).pipe(traced("Chain.balanceOf"))

  const authorizationState = (authorizer: Address, nonce: Hex) =>
    quickCall(
      "Chain.authorizationState",
      reads.bool("Chain.authorizationState", token, () => readCalldata.authorizationState(authorizer, nonce))
    ).pipe(traced("Chain.authorizationState"))

  const permit2NonceUsed = (owner: Address, nonce: bigint) =>
    Effect.suspend(() => {
      const { wordPos, bitPos } = nonceBitmapPosition(nonce)
      return quickCall(
        "Chain.permit2NonceUsed",
        reads.uint("Chain.permit2NonceUsed", PERMIT2_ADDRESS, () => readCalldata.nonceBitmap(owner, wordPos))
      ).pipe(Effect.map((word) => ((word >> bitPos) & 1n) === 1n))
    }).pipe(traced("Chain.permit2NonceUsed"))

  const permit2Allowance = (owner: Address) =>
    quickCall(
      "Chain.permit2Allowance",
      reads.uint("Chain.permit2Allowance", token, () => readCalldata.allowance(owner, PERMIT2_ADDRESS))
    ).pipe(traced("Chain.permit2Allowance"))

  const sendQuickReads = Effect.sync(() => reads.send())

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
        // Every settlement of an EOA's signature (v, r, s: one ecrecover) to one payee writes the same
        // kinds of slots: one estimate plans them (D530). A signature as bytes may be a contract wallet's
        // (ERC-1271), whose check costs what that wallet makes it cost: estimated every time.
        gasClass: split === undefined ? undefined : `transferWithAuthorization:${a.to.toLowerCase()}`,
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
    connection.backgroundRpc,
    connection.chainId,
    deployment.treasuryKey === undefined
      ? [deployment.routerKey]
      : [deployment.routerKey, deployment.treasuryKey]
  )

  // Over the light batch (D578), not viem's transport: the treasury's looks and passes ask for it every few seconds.
  const blockNumber = Effect.fn("Chain.blockNumber")(() => outgoing.head)

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
    headTimestamp,
    probe,
    balanceOf,
    authorizationState,
    authorizationFate: (authorizer: Address, nonce: Hex, sinceSeconds: bigint) =>
      readAuthorizationFate(publicClient, token, authorizer, nonce, sinceSeconds),
    permit2NonceUsed,
    permit2Allowance,
    sendQuickReads,
    simulateTransferWithAuthorization,
    waitForReceipt,
    anchoredRoot,
    signTypedData: (typedData: TypedDataDefinition) =>
      call("Chain.signTypedData", () => router.account.signTypedData(typedData)),
    signDigest: (digest: Hex) =>
      Effect.try({
        try: () => signDigestBytes(Buffer.from(digest.slice(2), "hex"), routerKeyBytes),
        catch: fromViemError("Chain.signDigest")
      }),
    readTransferLogs
  } satisfies ChainShape
})

/**
 * `CHAIN_BLOCK_TIME` (embedded chain only): seconds between blocks, 0 for a block per transaction; unset,
 * `fallback` (`npm start` paces its chain, tests mine a block per transaction; D450).
 */
export const miningConfig = (fallback: EmbeddedMining) =>
  Config.schema(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 60 })), "CHAIN_BLOCK_TIME").pipe(
    Config.option,
    Config.map(
      (seconds): EmbeddedMining =>
        Option.isNone(seconds)
          ? fallback
          : seconds.value === 0
            ? { _tag: "automine" }
            : { _tag: "interval", seconds: seconds.value }
    )
  )

const make = Effect.fnUntraced(function* (stateDir: string | undefined, defaultMining: EmbeddedMining) {
  const rpcUrl = yield* Config.option(Config.String("RPC_URL"))
  const configured = Option.getOrUndefined(rpcUrl)?.trim()
  // Native libsecp256k1 signs and recovers about 3-4x cheaper than its WebAssembly build (D529): say which.
  yield* Effect.logInfo("secp256k1", { build: secp256k1Backend })
  return yield* makeService(
    configured === undefined || configured === ""
      ? yield* embedded(stateDir, yield* miningConfig(defaultMining))
      : yield* external(configured)
  )
})

/**
 * The settlement chain: the stablecoin, the epoch anchor, and the accounts that use them.
 * Embedded (no RPC_URL) starts and seeds a private Anvil; external uses the configured RPC and contracts.
 */
export class Chain extends Context.Service<Chain, ChainShape>()("router/chain/Chain") {
  /** The embedded chain lives as long as the layer (tests); a block per transaction unless `CHAIN_BLOCK_TIME`. */
  static readonly layer = Layer.effect(Chain, make(undefined, { _tag: "automine" }))
  /**
   * The embedded chain persists in `DATA_DIR/chain` across restarts (`npm start`); its mining paced by
   * its load (`Mining.ts`) unless `CHAIN_BLOCK_TIME`.
   */
  static readonly layerDurable = Layer.effect(
    Chain,
    Effect.flatMap(RouterConfig, (config) => make(join(config.dataDir, "chain"), { _tag: "paced" }))
  )
}
