/**
 * The receipt signer's worker thread (`ReceiptSigner.ts`): each message is a batch of receipts; the
 * reply is their signatures by the router signer, computed as the main thread would (the digest of
 * `domain/ReceiptDigest.ts`, then viem's `account.sign`: noble's RFC 6979 with low s), so the bytes are
 * the same whichever thread signs. The key comes once, in `workerData`, and never leaves this thread.
 *
 * Loaded by Node itself (type stripping), so it imports nothing but noble and the digest.
 */
import { parentPort, workerData } from "node:worker_threads"
import { secp256k1 } from "@noble/curves/secp256k1"
import { type DigestedReceipt, receiptDigestBytes } from "../domain/ReceiptDigest.ts"

export interface SignerStart {
  readonly key: Uint8Array
  readonly chainId: number
}
export interface SignRequest {
  readonly id: number
  readonly receipts: ReadonlyArray<DigestedReceipt>
}
export type SignReply =
  | { readonly id: number; readonly signatures: ReadonlyArray<`0x${string}`> }
  | { readonly id: number; readonly error: string }
  /** Sent once, when the module has loaded: batches sent before it are signed on the main thread. */
  | { readonly ready: true }

const port = parentPort
if (port !== null) {
  const { key, chainId } = workerData as SignerStart

  /** r ‖ s ‖ v as viem serializes it: v is 27 for recovery 0, else 28. */
  const sign = (receipt: DigestedReceipt): `0x${string}` => {
    const signature = secp256k1.sign(receiptDigestBytes(receipt, chainId), key, {
      lowS: true,
      extraEntropy: false
    })
    return `0x${signature.toCompactHex()}${signature.recovery === 0 ? "1b" : "1c"}`
  }

  port.on("message", (request: SignRequest) => {
    let reply: SignReply
    try {
      reply = { id: request.id, signatures: request.receipts.map(sign) }
    } catch (error) {
      // One receipt the digest refuses fails its batch, as it would on the main thread.
      reply = { id: request.id, error: error instanceof Error ? error.message : String(error) }
    }
    port.postMessage(reply)
  })
  port.postMessage({ ready: true } satisfies SignReply)
}
