/**
 * EIP-1559 transactions signed by the router's own accounts without viem's local account: viem's
 * `serializeTransaction` (RLP, plain JavaScript and cheap) for the bytes, hash-wasm's WebAssembly
 * keccak (`domain/Keccak.ts`) for the signing hash and the transaction hash, and libsecp256k1
 * (`Secp256k1.ts`: native where its prebuilt binary loads, else WebAssembly) for the recoverable
 * signature. viem's `signTransaction` hashes with
 * noble's keccak and signs with noble's pure-JS secp256k1, about 0.5 ms of the main thread a
 * transaction (issue 12, D486). RFC 6979 nonces and low-s normalization on both sides: the bytes are
 * viem's, byte for byte (test/chain/transactionSigning.test.ts compares them over random fields).
 */

import { type Address, type Hash, type Hex, serializeTransaction } from "viem"
import { keccak256Bytes } from "../domain/Keccak.ts"
import { signRecoverable } from "./Secp256k1.ts"

/** The fields of an EIP-1559 contract call the router signs (no value, no access list). */
export interface Eip1559Call {
  readonly chainId: number
  readonly nonce: number
  readonly to: Address
  readonly data: Hex
  readonly gas: bigint
  readonly maxFeePerGas: bigint
  readonly maxPriorityFeePerGas: bigint
}

const bytesOf = (hex: Hex) => Buffer.from(hex.slice(2), "hex")
const hexOf = (bytes: Uint8Array): Hex => `0x${Buffer.from(bytes).toString("hex")}`

/**
 * The y parity of a recovery id (0–3: bit 0 is R's y parity, bit 1 says R's x overflowed the curve
 * order, which is practically never): `recoveryId & 1`.
 */
export const yParityOf = (recoveryId: number): 0 | 1 => ((recoveryId & 1) === 0 ? 0 : 1)

/**
 * The signed bytes of `call` by the account of `key` (32 bytes) and their hash, as viem's local
 * account's `signTransaction` and `keccak256` of its result give them. Throws on a key libsecp256k1
 * refuses (zero or not below the curve order).
 */
export const signEip1559 = (
  call: Eip1559Call,
  key: Uint8Array
): { readonly raw: Hex; readonly hash: Hash } => {
  const transaction = {
    type: "eip1559",
    chainId: call.chainId,
    nonce: call.nonce,
    to: call.to,
    data: call.data,
    value: 0n,
    gas: call.gas,
    maxFeePerGas: call.maxFeePerGas,
    maxPriorityFeePerGas: call.maxPriorityFeePerGas
  } as const
  const unsigned = serializeTransaction(transaction)
  const { signature, recoveryId } = signRecoverable(keccak256Bytes(bytesOf(unsigned)), key)
  const raw = serializeTransaction(transaction, {
    r: hexOf(signature.subarray(0, 32)),
    s: hexOf(signature.subarray(32, 64)),
    yParity: yParityOf(recoveryId)
  })
  return { raw, hash: hexOf(keccak256Bytes(bytesOf(raw))) }
}
