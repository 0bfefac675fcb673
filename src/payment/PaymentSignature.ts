import { Effect, Result } from "effect"
import { type Address, type Hex, hexToBigInt, size, slice } from "viem"
import { type ChainShape, verifyTransferAuthorization } from "../chain/Chain.ts"
import { verifyUptoPermitSignature } from "../chain/UptoPermit.ts"
import { decodePaymentSignature, type ExactPayment, type UptoPayment } from "./X402.ts"

/**
 * What the one check of a payment header's signature found (`checkPaymentSignature`), carried with the
 * call: the idempotency scope names the payer before the verifier runs, and the verifier takes this
 * answer instead of checking again. It answers only for the very header it was made of.
 */
export interface SignatureCheck {
  /** The `PAYMENT-SIGNATURE` header exactly as checked. */
  readonly header: string
  /** `authorization.from` (`permit2Authorization.from` for `upto`). */
  readonly payer: Address
  /** Whether the signature is the payer's over this authorization (canonical, for `exact`). */
  readonly valid: boolean
}

/** The chain facts a payment's signature is checked against (the token's EIP-712 domain, the chain). */
export type SignatureDomain = Pick<ChainShape, "chainId" | "token" | "tokenDomain">

/**
 * Whether a decoded payment is signed by the wallet it names: for `exact`, a canonical (low-s)
 * TransferWithAuthorization signature over the token's domain; for `upto`, the Permit2 witness
 * signature. CPU only (a known signer's check, else a public-key recovery), never an error.
 */
export const paymentSigned = (
  chain: SignatureDomain,
  payment: ExactPayment | UptoPayment
): Effect.Effect<boolean> =>
  payment.scheme === "upto"
    ? verifyUptoPermitSignature(chain.chainId, { ...payment.authorization, signature: payment.signature })
    : isCanonicalSignature(payment.signature)
      ? Effect.tryPromise(() =>
          verifyTransferAuthorization({
            token: chain.token,
            chainId: chain.chainId,
            domain: chain.tokenDomain,
            ...payment.authorization,
            signature: payment.signature
          })
        ).pipe(Effect.orElseSucceed(() => false))
      : Effect.succeed(false)

/** The one signature check of a header, to carry (`SignatureCheck`); none when the header does not decode. */
export const checkPaymentSignature = (
  chain: SignatureDomain,
  header: string
): Effect.Effect<SignatureCheck | undefined> => {
  const decoded = decodePaymentSignature(header)
  if (Result.isFailure(decoded)) return Effect.succeed(undefined)
  const payment = decoded.success
  return Effect.map(paymentSigned(chain, payment), (valid) => ({
    header,
    payer: payment.authorization.from,
    valid
  }))
}

const SECP256K1_HALF_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n / 2n

/** The token refuses high-s signatures, so accepting one here would serve a request that can never settle. */
const isCanonicalSignature = (signature: Hex) =>
  size(signature) === 65 && hexToBigInt(slice(signature, 32, 64)) <= SECP256K1_HALF_N
