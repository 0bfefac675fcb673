import { Clock, Context, Effect, Fiber, Layer, Result } from "effect"
import { type Address, type Hex, hexToBigInt, size, slice } from "viem"
import { Chain, type ChainShape, verifyTransferAuthorization } from "../chain/Chain.ts"
import type { PaymentRequired, PaymentRequiredCode } from "../domain/X402.ts"
import {
  decodePaymentSignature,
  EXACT_MAX_VALIDITY_S,
  EXACT_MIN_RUNWAY_S,
  type ExactPayment,
  PAYMENT_CLOCK_SKEW_S,
  paymentRequired,
  X402Config,
  type X402Limits,
  type X402Settings
} from "./X402.ts"

/** An `exact` payment that passed every check; nothing has been submitted yet. */
export interface VerifiedPayment {
  readonly scheme: "exact"
  readonly payer: Address
  /** Base units authorized: at least the quoted worst case. */
  readonly value: bigint
  readonly authorization: ExactPayment["authorization"]
  readonly signature: Hex
  readonly network: string
  /** The payer's token balance as read during verification (base units). */
  readonly balance: bigint
}

export interface VerifyExactInput {
  /** The `PAYMENT-SIGNATURE` header as received. */
  readonly header: string
  /** Base units: the most this request can cost. */
  readonly worstCase: number
  readonly resourceUrl: string
  readonly description: string
  /**
   * Whether the caller's database has never seen this (payer, nonce). Infallible by type: the caller
   * decides what its own database failure means.
   */
  readonly nonceUnused: (payer: Address, nonce: Hex) => Effect.Effect<boolean>
}

export interface QuoteInput {
  readonly worstCase: number
  readonly resourceUrl: string
  readonly description: string
}

const SECP256K1_HALF_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n / 2n

/** The token refuses high-s signatures, so accepting one here would serve a request that can never settle. */
const isCanonicalSignature = (signature: Hex) =>
  size(signature) === 65 && hexToBigInt(slice(signature, 32, 64)) <= SECP256K1_HALF_N

export const x402Settings = (chain: ChainShape, limits: X402Limits): X402Settings => ({
  network: chain.network,
  asset: chain.token,
  payTo: chain.treasury,
  tokenDomain: chain.tokenDomain,
  maxTimeoutSeconds: limits.maxTimeoutSeconds,
  soloSettleFloor: limits.soloSettleFloor,
  paymentCap: limits.paymentCap
})

/**
 * Checks a direct x402 `exact` payment before any provider work: it only reads (signature recovery, the
 * token's nonce state, the payer's balance) and never submits, so every rejection moves no money. Each
 * rejection is a 402 carrying fresh `accepts`, so the client can sign again.
 */
export class PaymentVerifier extends Context.Service<
  PaymentVerifier,
  {
    readonly settings: X402Settings
    /** The 402 for a request that arrived without a payment. */
    readonly quote: (input: QuoteInput) => PaymentRequired
    readonly verifyExact: (input: VerifyExactInput) => Effect.Effect<VerifiedPayment, PaymentRequired>
  }
>()("router/payment/PaymentVerifier") {
  static readonly layer = Layer.effect(
    PaymentVerifier,
    Effect.gen(function* () {
      const chain = yield* Chain
      const settings = x402Settings(chain, yield* X402Config)

      const quote = (input: QuoteInput) =>
        paymentRequired({ settings, ...input, error: "payment required: sign the quoted maximum" })

      const verifyExact = Effect.fn("PaymentVerifier.verifyExact")(function* (input: VerifyExactInput) {
        const rejectWith = (
          code: PaymentRequiredCode,
          error: string,
          extra: { readonly retryable?: boolean } = {}
        ): Effect.Effect<never, PaymentRequired> =>
          Effect.annotateCurrentSpan({ "payment.rejected": code }).pipe(
            Effect.andThen(
              Effect.fail(
                paymentRequired({
                  settings,
                  worstCase: input.worstCase,
                  resourceUrl: input.resourceUrl,
                  description: input.description,
                  code,
                  error,
                  ...extra
                })
              )
            )
          )

        if (input.worstCase > settings.paymentCap) {
          return yield* rejectWith("payment_limit", "worst case above the payment cap")
        }

        const decoded = decodePaymentSignature(input.header)
        if (Result.isFailure(decoded)) {
          const { reason, message } = decoded.failure
          return yield* rejectWith(
            reason === "unsupported_scheme" ? "wrong_scheme" : "payment_invalid",
            message
          )
        }
        const { network, asset, payTo, authorization, signature } = decoded.success
        const { from, to, value, validAfter, validBefore, nonce } = authorization
        yield* Effect.annotateCurrentSpan({ "payment.payer": from, "payment.value": value.toString() })

        if (network !== settings.network) {
          return yield* rejectWith("payment_invalid", `network must be ${settings.network}`)
        }
        // Every field the envelope names is the quote's: a signature valid for the real token under
        // an envelope naming another asset or recipient is refused, before anything is reserved.
        if (asset !== undefined && asset.toLowerCase() !== settings.asset.toLowerCase()) {
          return yield* rejectWith(
            "payment_invalid",
            `accepted.asset must be the quoted token ${settings.asset} on ${settings.network}`
          )
        }
        if (payTo !== undefined && payTo.toLowerCase() !== settings.payTo.toLowerCase()) {
          return yield* rejectWith("payment_invalid", `accepted.payTo must be the treasury ${settings.payTo}`)
        }
        if (to !== settings.payTo) {
          return yield* rejectWith(
            "payment_invalid",
            `authorization.to must be the treasury ${settings.payTo}`
          )
        }
        if (value < BigInt(settings.soloSettleFloor)) {
          return yield* rejectWith(
            "solo_settle_floor",
            `the signed amount is below the solo settlement floor of ${settings.soloSettleFloor} base units`
          )
        }
        if (value < BigInt(input.worstCase)) {
          return yield* rejectWith("payment_invalid", "signed amount below the quoted maximum")
        }

        const now = BigInt(Math.floor((yield* Clock.currentTimeMillis) / 1000))
        const skew = BigInt(PAYMENT_CLOCK_SKEW_S)
        if (validAfter > now + skew) {
          return yield* rejectWith("payment_invalid", "authorization.validAfter has not passed yet")
        }
        if (validBefore < now + BigInt(EXACT_MIN_RUNWAY_S) - skew) {
          return yield* rejectWith(
            "payment_invalid",
            `authorization.validBefore must be at least ${EXACT_MIN_RUNWAY_S} seconds ahead`
          )
        }
        if (validBefore > now + BigInt(EXACT_MAX_VALIDITY_S) + skew) {
          return yield* rejectWith("payment_invalid", "authorization.validBefore must be within 7 days")
        }

        const unavailable = () =>
          rejectWith(
            "payment_verification_unavailable",
            "the payer's on-chain state could not be read; the signature was not rejected",
            { retryable: true }
          )
        // Signature recovery is CPU work and the three reads are I/O: start the reads first and
        // recover while they are in flight (this is on every paid call's first-byte path).
        const reads = yield* Effect.all(
          [
            input.nonceUnused(from, nonce),
            chain.authorizationState(from, nonce).pipe(Effect.catch(unavailable)),
            chain.balanceOf(from).pipe(Effect.catch(unavailable))
          ],
          { concurrency: "unbounded" }
        ).pipe(Effect.forkChild({ startImmediately: true }))
        const recovered =
          isCanonicalSignature(signature) &&
          (yield* Effect.tryPromise(() =>
            verifyTransferAuthorization({
              token: settings.asset,
              chainId: chain.chainId,
              domain: settings.tokenDomain,
              ...authorization,
              signature
            })
          ).pipe(Effect.catch(() => Effect.succeed(false))))
        if (!recovered) {
          yield* Fiber.interrupt(reads)
          return yield* rejectWith(
            "payment_invalid",
            "the signature is not a TransferWithAuthorization signed by authorization.from for this token"
          )
        }
        const [unusedHere, usedOnChain, balance] = yield* Fiber.join(reads)
        if (!unusedHere || usedOnChain) {
          return yield* rejectWith("payment_invalid", "authorization already used")
        }
        if (balance < value) {
          return yield* rejectWith("payment_invalid", "insufficient balance")
        }

        return {
          scheme: "exact",
          payer: from,
          value,
          authorization,
          signature,
          network,
          balance
        } satisfies VerifiedPayment
      })

      return PaymentVerifier.of({ settings, quote, verifyExact })
    })
  )
}
