import { Effect } from "effect"
import type { Hex } from "viem"
import type { ChainShape } from "../chain/Chain.ts"
import type { ChainError } from "../chain/ChainError.ts"
import { type ReceiptBody, receiptDigest } from "../domain/Receipt.ts"

/**
 * Receipts signed in one go before the event loop gets a turn: 32 take about 10 ms of the main
 * thread, so the largest batch (500, a backlog or the sweep) does not hold a streamed reply for 170 ms.
 */
const SIGNED_PER_TURN = 32

/** The router signer's signature of one receipt (the bytes of viem's `signTypedData` of its typed data). */
export const signReceipt = (chain: ChainShape, receipt: ReceiptBody): Effect.Effect<Hex, ChainError> =>
  chain.signDigest(receiptDigest(receipt, chain.chainId))

/**
 * The router signer's signatures of `receipts`, in order: each receipt's EIP-712 digest
 * (`domain/ReceiptDigest.ts`) signed by `chain.signDigest` (libsecp256k1 in WebAssembly, RFC 6979,
 * low s: viem's `signTypedData` bytes). On the main thread (D433): about 0.17 ms a receipt, of which
 * the digest (WebAssembly keccak, D480) is 11-15 µs (`npm run bench:receipt-digest`); the worker
 * thread that signed them with noble (D390) cost more CPU in all and 20-28 MB
 * of RSS once signing was this cheap.
 */
export const signReceipts = (
  chain: ChainShape,
  receipts: ReadonlyArray<ReceiptBody>
): Effect.Effect<ReadonlyArray<Hex>, ChainError> =>
  Effect.gen(function* () {
    const signatures: Array<Hex> = []
    for (const [i, receipt] of receipts.entries()) {
      if (i > 0 && i % SIGNED_PER_TURN === 0) yield* Effect.yieldNow
      signatures.push(yield* signReceipt(chain, receipt))
    }
    return signatures
  })
