import { Config, Effect, Option, Redacted, Schema } from "effect"
import { getAddress, type Hash, type Hex, toHex } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { launchAnvil } from "./Anvil.ts"
import { epochAnchorAbi, epochAnchorBytecode, testUsdcAbi, testUsdcBytecode } from "./artifacts.ts"
import { ChainError } from "./ChainError.ts"
import {
  type Connection,
  call,
  connect,
  DEMO_WALLET_FUNDING,
  type Deployment,
  makeSender,
  QUICK_READ_TIMEOUT_MS,
  type Sender,
  type SignerWallet
} from "./Connection.ts"
import { demoWalletAccounts, privateKeyOf, routerSignerAccount, treasuryAccount } from "./DevAccounts.ts"
import { type EmbeddedContracts, prepareState, readContracts, writeContracts } from "./EmbeddedState.ts"
import { type EmbeddedMining, paceMining } from "./Mining.ts"
import { ensureUptoContracts } from "./Permit2.ts"
import { httpPost } from "./QuickReads.ts"

/**
 * Where the chain comes from: an embedded Anvil with the project's contracts deployed (or reloaded from
 * `DATA_DIR/chain`), or an external RPC with configured addresses. Either yields one `Deployment`.
 */

export const deployContract = Effect.fnUntraced(function* (
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
export const deployFresh = Effect.fnUntraced(function* (connection: Connection, router: Sender) {
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
export const isDeployed = (connection: Connection, contracts: EmbeddedContracts) =>
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
 * it lives as long as the layer. `mining`: how its blocks are mined (`Mining.ts`).
 */
export const embedded = Effect.fnUntraced(function* (
  stateDir: string | undefined,
  mining: EmbeddedMining = { _tag: "automine" }
) {
  const state = stateDir === undefined ? undefined : yield* prepareState(stateDir)
  const anvil = yield* launchAnvil({
    state,
    blockTime: mining._tag === "interval" ? mining.seconds : undefined
  })
  const connection = connect(anvil.rpcUrl, anvil.chainId, 50)
  if (mining._tag === "paced") yield* paceMining(httpPost(anvil.rpcUrl, QUICK_READ_TIMEOUT_MS))
  // Permit2 and the upto proxy at their canonical addresses (idempotent: a resumed chain has them).
  yield* ensureUptoContracts(connection)
  const routerAccount = routerSignerAccount()
  const router = yield* makeSender(connection, routerAccount)
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
  return yield* Effect.succeed<Deployment>({
    mode: "embedded",
    connection,
    router,
    routerKey: Redacted.make(privateKeyOf(routerAccount)),
    treasurySender,
    treasuryKey: Redacted.make(privateKeyOf(treasuryAccount())),
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

export const AddressConfig = (name: string) =>
  Config.schema(Schema.String.check(Schema.isPattern(/^0x[0-9a-fA-F]{40}$/)), name).pipe(
    Config.map((address) => getAddress(address.toLowerCase()))
  )

export const isPrivateKey = (value: string): value is Hex => /^0x[0-9a-fA-F]{64}$/.test(value)

/** A configured private key, `0x`-prefixed and checked to be 32 bytes of hex. */
export const privateKeyFrom = (name: string, key: Redacted.Redacted<string>) => {
  const raw = Redacted.value(key).trim()
  const hex = raw.startsWith("0x") ? raw : `0x${raw}`
  return isPrivateKey(hex)
    ? Effect.succeed(Redacted.make(hex))
    : Effect.fail(new ChainError({ reason: "Config", message: `${name} is not a 32-byte hex private key` }))
}

/** RPC_URL set: the configured chain, token and anchor; the router key signs and pays gas. */
export const external = Effect.fnUntraced(function* (rpcUrl: string) {
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
  const routerKey = yield* privateKeyFrom("ROUTER_PRIVATE_KEY", config.routerKey)
  const router = yield* makeSender(connection, privateKeyToAccount(Redacted.value(routerKey)))
  const configuredTreasuryKey = Option.getOrUndefined(config.treasuryKey)
  let treasurySender: Sender | undefined
  let treasuryKey: Redacted.Redacted<Hex> | undefined
  if (configuredTreasuryKey !== undefined) {
    treasuryKey = yield* privateKeyFrom("TREASURY_PRIVATE_KEY", configuredTreasuryKey)
    const account = privateKeyToAccount(Redacted.value(treasuryKey))
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
  return yield* Effect.succeed<Deployment>({
    mode: "external",
    connection,
    router,
    routerKey,
    treasurySender,
    treasuryKey,
    treasury: config.treasury,
    token: config.token,
    anchor: config.anchor,
    demoWallets: []
  })
})
