/**
 * Deploys the project's test USDC and epoch anchor to RPC_URL with ROUTER_PRIVATE_KEY and
 * mints 10,000 test USDC to each demo wallet of the public dev mnemonic. For a chain the
 * router does not start itself (docker-compose's Anvil); prints the addresses to export.
 * Then Permit2 and the x402 upto proxy: placed at their canonical addresses where those are empty and the
 * node offers `anvil_setCode` or `hardhat_setCode`; otherwise what is there is reported.
 */
import { Effect } from "effect"
import { createPublicClient, createWalletClient, type Hex, http } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { epochAnchorAbi, epochAnchorBytecode, testUsdcAbi, testUsdcBytecode } from "../src/chain/artifacts.ts"
import { DEMO_WALLET_FUNDING } from "../src/chain/Chain.ts"
import { demoWalletAccounts } from "../src/chain/DevAccounts.ts"
import {
  ensureUptoContracts,
  inspectUptoContracts,
  PERMIT2_ADDRESS,
  UPTO_PROXY_ADDRESS,
  type UptoContractsReport
} from "../src/chain/Permit2.ts"

const rpcUrl = process.env.RPC_URL
const key = process.env.ROUTER_PRIVATE_KEY as Hex | undefined
if (!rpcUrl || !key) {
  process.stderr.write("RPC_URL and ROUTER_PRIVATE_KEY are required\n")
  process.exit(2)
}
const account = privateKeyToAccount(key)
const publicClient = createPublicClient({ transport: http(rpcUrl) })
const chainId = await publicClient.getChainId()
const chain = {
  id: chainId,
  name: `chain-${chainId}`,
  nativeCurrency: { name: "ETH", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpcUrl] } }
}
const wallet = createWalletClient({ account, chain, transport: http(rpcUrl) })

const deploy = async (abi: typeof testUsdcAbi | typeof epochAnchorAbi, bytecode: Hex) => {
  const hash = await wallet.deployContract({ abi, bytecode, account, chain })
  const receipt = await publicClient.waitForTransactionReceipt({ hash })
  if (!receipt.contractAddress) throw new Error("deployment failed")
  return receipt.contractAddress
}

const token = await deploy(testUsdcAbi, testUsdcBytecode)
const anchor = await deploy(epochAnchorAbi, epochAnchorBytecode)
for (const demo of demoWalletAccounts()) {
  const hash = await wallet.writeContract({
    address: token,
    abi: testUsdcAbi,
    functionName: "mint",
    args: [demo.address, DEMO_WALLET_FUNDING],
    account,
    chain
  })
  await publicClient.waitForTransactionReceipt({ hash })
}
process.stdout.write(`CHAIN_ID=${chainId}\nTOKEN_ADDRESS=${token}\nANCHOR_ADDRESS=${anchor}\n`)

const found = await Effect.runPromise(inspectUptoContracts(publicClient, chainId))
let upto: UptoContractsReport & { readonly placedBy?: string } = found
if (found.permit2 !== "unexpected" && found.uptoProxy !== "unexpected") {
  for (const mode of ["anvil", "hardhat"] as const) {
    if (upto.permit2 === "ok" && upto.uptoProxy === "ok") break
    const placed = await Effect.runPromise(
      ensureUptoContracts({ rpcUrl, chainId, publicClient }, mode).pipe(Effect.option)
    )
    if (placed._tag === "Some") upto = { permit2: "ok", uptoProxy: "ok", placedBy: `${mode}_setCode` }
  }
}
const describe = (state: string, before: string) =>
  state === "ok" && before === "absent" && upto.placedBy !== undefined
    ? `placed with ${upto.placedBy}`
    : state
process.stdout.write(
  `# Permit2 ${PERMIT2_ADDRESS}: ${describe(upto.permit2, found.permit2)}\n` +
    `# x402 upto proxy ${UPTO_PROXY_ADDRESS}: ${describe(upto.uptoProxy, found.uptoProxy)}\n`
)
