import { randomBytes } from "node:crypto"
import type { Address, Hex, LocalAccount } from "viem"
import { bytesToHex, hashTypedData } from "viem"
import { signedBy } from "./SignerKeys.ts"

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
): Promise<boolean> => {
  const key = [
    params.token,
    params.chainId,
    params.domain.name,
    params.domain.version,
    params.from,
    params.to,
    params.value,
    params.validAfter,
    params.validBefore,
    params.nonce,
    params.signature
  ].join("|")
  const known = recentVerifications.get(key)
  if (known !== undefined) return known
  const verified = (async () =>
    signedBy(params.from, hashTypedData(typedData(params.from, params)), params.signature))()
  recentVerifications.set(key, verified)
  if (recentVerifications.size > RECENT_VERIFICATIONS) {
    recentVerifications.delete(recentVerifications.keys().next().value!)
  }
  return verified
}

/**
 * Answers of `verifyTransferAuthorization` for the most recent inputs. An x402 call checks its
 * authorization twice (the idempotency scope names the payer, then the payment verifier), and each check
 * is a public-key recovery in pure JS (about 1 ms, the largest single CPU cost of an x402 call): the
 * answer is a pure function of the inputs, so the second check reuses the first's. Bounded, oldest first.
 */
const recentVerifications = new Map<string, Promise<boolean>>()
const RECENT_VERIFICATIONS = 1024
