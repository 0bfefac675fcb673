import { randomBytes } from "node:crypto"
import type { Address, Hex, LocalAccount } from "viem"
import { bytesToHex, verifyTypedData } from "viem"

/** The token's EIP-712 domain, minus the chain id and verifying contract (USDC: "USD Coin", "2"). */
export interface TokenDomain {
  readonly name: string
  readonly version: string
}

export const transferWithAuthorizationTypes = {
  TransferWithAuthorization: [
    { name: "from", type: "address" },
    { name: "to", type: "address" },
    { name: "value", type: "uint256" },
    { name: "validAfter", type: "uint256" },
    { name: "validBefore", type: "uint256" },
    { name: "nonce", type: "bytes32" }
  ]
} as const

export interface TransferAuthorizationParams {
  readonly token: Address
  readonly chainId: number
  readonly domain: TokenDomain
  readonly to: Address
  readonly value: bigint
  /** Unix seconds; the authorization is usable strictly after this. */
  readonly validAfter: bigint
  /** Unix seconds; the authorization is usable strictly before this. */
  readonly validBefore: bigint
  readonly nonce: Hex
}

/** A fresh random 32-byte authorization nonce (EIP-3009 nonces are random, not sequential). */
export const randomAuthorizationNonce = (): Hex => bytesToHex(randomBytes(32))

const typedData = (from: Address, params: TransferAuthorizationParams) =>
  ({
    domain: {
      name: params.domain.name,
      version: params.domain.version,
      chainId: params.chainId,
      verifyingContract: params.token
    },
    types: transferWithAuthorizationTypes,
    primaryType: "TransferWithAuthorization",
    message: {
      from,
      to: params.to,
      value: params.value,
      validAfter: params.validAfter,
      validBefore: params.validBefore,
      nonce: params.nonce
    }
  }) as const

/**
 * Signs an EIP-3009 TransferWithAuthorization from `account` exactly as the official x402 client does.
 * A plain Promise: used by tests and demo scripts, not by the router.
 */
export const signTransferAuthorization = (
  account: LocalAccount,
  params: TransferAuthorizationParams
): Promise<Hex> => account.signTypedData(typedData(account.address, params))

/**
 * Off-chain check that `signature` is `from`'s EOA signature over the authorization. Contract wallets
 * (ERC-1271) and the on-chain conditions (balance, nonce, validity window) need
 * `Chain.simulateTransferWithAuthorization` instead.
 */
export const verifyTransferAuthorization = (
  params: TransferAuthorizationParams & { readonly from: Address; readonly signature: Hex }
): Promise<boolean> =>
  verifyTypedData({ address: params.from, signature: params.signature, ...typedData(params.from, params) })
