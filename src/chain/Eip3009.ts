import { randomBytes } from "node:crypto"
import type { Address, Hex, LocalAccount } from "viem"
import { bytesToHex, domainSeparator, hashTypedData, isAddress, keccak256 } from "viem"
import { keccak256Bytes } from "../domain/Keccak.ts"
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
 * `Chain.simulateTransferWithAuthorization` instead. An x402 call checks its authorization once and
 * carries the answer (`PaymentSignature.SignatureCheck`); a payer seen before is checked without a
 * public-key recovery (`signedBy`). A digest viem refuses is a rejected promise.
 */
export const verifyTransferAuthorization = async (
  params: TransferAuthorizationParams & { readonly from: Address; readonly signature: Hex }
): Promise<boolean> =>
  signedBy(params.from, transferAuthorizationDigest(params.from, params), params.signature)

const TRANSFER_TYPEHASH = keccak256(
  new TextEncoder().encode(
    `TransferWithAuthorization(${transferWithAuthorizationTypes.TransferWithAuthorization.map((f) => `${f.type} ${f.name}`).join(",")})`
  )
)
const UINT256_LIMIT = 2n ** 256n
const BYTES32 = /^0x[0-9a-fA-F]{64}$/
const word = (value: bigint) => value.toString(16).padStart(64, "0")
const addressWord = (address: Address) => address.slice(2).toLowerCase().padStart(64, "0")
/** Domain separators (bytes) by token, chain, name and version (a router has one; bounded all the same). */
const separators = new Map<string, Uint8Array>()

/**
 * The EIP-712 digest of a TransferWithAuthorization: `hashTypedData`'s answer, written out for this one
 * type (the domain separator kept per token), since viem's generic encoder (type discovery, validation,
 * encoding by walking the types) cost more than the rest of the check but the curve arithmetic (issue 12,
 * D328); its two keccaks are `Keccak.ts`'s WebAssembly one (D480). Inputs viem would refuse or read
 * otherwise (an address failing its checksum, a uint out of range, a nonce not 32 bytes) go to viem
 * itself, so the answer, or the error, is always viem's.
 */
export const transferAuthorizationDigest = (from: Address, params: TransferAuthorizationParams): Hex => {
  const uints = [params.value, params.validAfter, params.validBefore]
  const canonical =
    isAddress(from) &&
    isAddress(params.to) &&
    isAddress(params.token) &&
    BYTES32.test(params.nonce) &&
    Number.isSafeInteger(params.chainId) &&
    params.chainId >= 0 &&
    uints.every((n) => typeof n === "bigint" && n >= 0n && n < UINT256_LIMIT) &&
    typeof params.domain.name === "string" &&
    typeof params.domain.version === "string"
  if (!canonical) return hashTypedData(typedData(from, params))
  const domainKey = `${params.token.toLowerCase()}|${params.chainId}|${params.domain.name}|${params.domain.version}`
  let separator = separators.get(domainKey)
  if (separator === undefined) {
    separator = Buffer.from(
      domainSeparator({
        domain: {
          name: params.domain.name,
          version: params.domain.version,
          chainId: params.chainId,
          verifyingContract: params.token
        }
      }).slice(2),
      "hex"
    )
    if (separators.size >= 16) separators.clear()
    separators.set(domainKey, separator)
  }
  const struct = Buffer.from(
    `${TRANSFER_TYPEHASH.slice(2)}${addressWord(from)}${addressWord(params.to)}${word(params.value)}${word(params.validAfter)}${word(params.validBefore)}${params.nonce.slice(2)}`,
    "hex"
  )
  const envelope = new Uint8Array(2 + 64)
  envelope[0] = 0x19
  envelope[1] = 0x01
  envelope.set(separator, 2)
  envelope.set(keccak256Bytes(struct), 34)
  return `0x${Buffer.from(keccak256Bytes(envelope)).toString("hex")}`
}
