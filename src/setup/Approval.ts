import { getAddress, type Hex } from "viem"
import type { Harness } from "../domain/Setup.ts"

/**
 * EIP-712 typed data of an agent-setup approval (docs/protocol.md, "Agent setup"). The wallet signs
 * exactly the terms the router stored for the setup, with the budget it approves (at most the one asked).
 * `setup` is a random nonce per setup, so a signature approves one setup once and nothing else.
 */
export const approvalTypes = {
  AgentSetupApproval: [
    { name: "wallet", type: "address" },
    { name: "setup", type: "bytes32" },
    { name: "userCode", type: "string" },
    { name: "harness", type: "string" },
    { name: "network", type: "string" },
    { name: "budget", type: "uint256" },
    { name: "keyExpiresAt", type: "uint256" }
  ]
} as const

export const APPROVAL_PRIMARY_TYPE = "AgentSetupApproval" as const

export const approvalDomain = (chainId: number) =>
  ({ name: "svc Agent Setup", version: "1", chainId }) as const

/** The domain's own type list, which `eth_signTypedData_v4` wallets expect inside `types`. */
export const eip712DomainType = [
  { name: "name", type: "string" },
  { name: "version", type: "string" },
  { name: "chainId", type: "uint256" }
] as const

export interface ApprovalTerms {
  /** 0x-prefixed 32 bytes. */
  readonly setupId: string
  readonly userCode: string
  readonly harness: Harness
  /** CAIP-2, e.g. `eip155:8453`. */
  readonly network: string
  /** Base units. */
  readonly budget: number
  /** Unix seconds. */
  readonly keyExpiresAt: number
}

/** The message as viem signs and verifies it. */
export const approvalMessage = (terms: ApprovalTerms, wallet: string) => ({
  wallet: getAddress(wallet.toLowerCase()),
  setup: terms.setupId as Hex,
  userCode: terms.userCode,
  harness: terms.harness,
  network: terms.network,
  budget: BigInt(terms.budget),
  keyExpiresAt: BigInt(terms.keyExpiresAt)
})

/**
 * The typed data as JSON for a browser wallet's `eth_signTypedData_v4`, every field filled but `wallet`
 * (the page adds the connected account) and integers as decimal strings.
 */
export const approvalTypedData = (terms: ApprovalTerms, chainId: number) => ({
  domain: approvalDomain(chainId),
  types: { EIP712Domain: eip712DomainType, ...approvalTypes },
  primaryType: APPROVAL_PRIMARY_TYPE,
  message: {
    setup: terms.setupId,
    userCode: terms.userCode,
    harness: terms.harness,
    network: terms.network,
    budget: String(terms.budget),
    keyExpiresAt: String(terms.keyExpiresAt)
  }
})
