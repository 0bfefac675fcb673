/**
 * Deploys the project's test USDC and epoch anchor to RPC_URL with ROUTER_PRIVATE_KEY and
 * mints 10,000 test USDC to each demo wallet of the public dev mnemonic. For a chain the
 * router does not start itself (docker-compose's Anvil); prints the addresses to export.
 */
import { createPublicClient, createWalletClient, type Hex, http } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import { epochAnchorAbi, epochAnchorBytecode, testUsdcAbi, testUsdcBytecode } from "../src/chain/artifacts.ts"
import { DEMO_WALLET_FUNDING } from "../src/chain/Chain.ts"
import { demoWalletAccounts } from "../src/chain/DevAccounts.ts"

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
