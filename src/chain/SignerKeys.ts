import { type Address, type Hex, isAddress, verifyHash } from "viem"
import { keccak256Bytes } from "../domain/Keccak.ts"
import { recoverPublicKeyBytes } from "./Secp256k1.ts"

/**
 * Whether `signature` over `hash` was made by `address`: the answer of viem's `verifyHash` (recover the
 * public key, compare addresses), with the recovery done by libsecp256k1 in WebAssembly (`Secp256k1.ts`,
 * ~0.4 ms where viem's pure-JS recovery took 2.9-3.8 ms and the kept-key check it replaces ~0.8 ms, D431).
 * An input that recovers no key (malformed, out of range) or an address viem refuses gets viem's own
 * answer, an error included, so every answer is viem's (test/chain/signerKeys.test.ts compares them).
 */
export const signedBy = async (address: Address, hash: Hex, signature: Hex): Promise<boolean> => {
  const publicKey = recoverPublicKeyBytes(hash, signature)
  if (publicKey === undefined || !isAddress(address, { strict: false })) {
    return verifyHash({ address, hash, signature })
  }
  const signer = Buffer.from(keccak256Bytes(publicKey.subarray(1)).subarray(12)).toString("hex")
  return signer === address.slice(2).toLowerCase()
}
