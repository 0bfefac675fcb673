import { Clock, Context, Effect, Fiber, Layer, Result } from "effect"
import type { Address, Hex } from "viem"
import { Chain, type ChainShape } from "../chain/Chain.ts"
import type { PaymentRequired, PaymentRequiredCode } from "../domain/X402.ts"
import { type UptoNonceKey, uptoNonceKey } from "../ledger/Ledger.ts"
import { traced } from "../Telemetry.ts"
import { fundsSeen } from "./FundsSeen.ts"
import { paymentSigned, type SignatureCheck } from "./PaymentSignature.ts"
import {
  decodePaymentSignature,
  EXACT_MAX_VALIDITY_S,
  EXACT_MIN_RUNWAY_S,
  type ExactPayment,
  PAYMENT_CLOCK_SKEW_S,
  paymentRequired,
  UPTO_MAX_DEADLINE_S,
  UPTO_MIN_DEADLINE_S,
  type UptoPayment,
  X402Config,
  type X402Limits,
  type X402Settings
} from "./X402.ts"

/** A direct x402 payment that passed every check: `exact` or `upto`. Nothing has been submitted yet. */
export type VerifiedPayment = VerifiedExact | VerifiedUpto

/** An `upto` payment that passed every check: a ceiling the router settles the metered actual of. */
export interface VerifiedUpto {
  readonly scheme: "upto"
  readonly payer: Address
  /** Base units: the signed ceiling, at least the quoted worst case. */
  readonly value: bigint
  readonly authorization: UptoPayment["authorization"]
  readonly signature: Hex
  readonly network: string
  /** The key of its Permit2 nonce in the ledger. */
  readonly nonceKey: UptoNonceKey
  /** The payer's token balance as read during verification (base units). */
  readonly balance: bigint
}

/** An `exact` payment that passed every check; nothing has been submitted yet. */
export interface VerifiedExact {
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

/** A verified payment before the chain answered: everything but the balance. */
export type UnreadPayment = Omit<VerifiedExact, "balance"> | Omit<VerifiedUpto, "balance">

/**
 * A payment whose terms and signature passed, with its chain reads (the nonce's state, the payer's funds)
 * in flight (D543): what a reservation needs now, and the chain's verdict, to be taken before anything is
 * served.
 */
export interface StartedPayment {
  readonly payment: UnreadPayment
  /** The chain's answer: the payment verified, with the balance read, or its refusal. */
  readonly onChain: Effect.Effect<VerifiedPayment, PaymentRequired>
  /** Stops the reads: the call was refused before their answer was needed. */
  readonly cancel: Effect.Effect<void>
  /**
   * Whether the chain showed this router, within the last minute, funds of this payer covering this
   * value: only then may a reservation go out before `onChain` answers (D543).
   */
  readonly vouched: boolean
}

export interface VerifyExactInput {
  /** The `PAYMENT-SIGNATURE` header as received. */
  readonly header: string
  /**
   * This call's signature check, when it was made before verification (the idempotency scope): taken
   * only when its `header` is this one, else the signature is checked here.
   */
  readonly signed?: SignatureCheck | undefined
  /** Base units: the most this request can cost. */
  readonly worstCase: number
  readonly resourceUrl: string
  readonly description: string
}

export interface VerifyInput extends VerifyExactInput {
  /** Whether this surface takes `upto` (per-turn completions); elsewhere an `upto` payment is `wrong_scheme`. */
  readonly upto: boolean
}

export interface QuoteInput {
  readonly worstCase: number
  readonly resourceUrl: string
  readonly description: string
  /** Whether `accepts` lists `upto` after `exact` (per-turn completions). */
  readonly upto?: boolean
}

export const x402Settings = (chain: ChainShape, limits: X402Limits): X402Settings => ({
  network: chain.network,
  asset: chain.token,
  payTo: chain.treasury,
  tokenDomain: chain.tokenDomain,
  maxTimeoutSeconds: limits.maxTimeoutSeconds,
  facilitator: chain.routerSigner,
  uptoProxy: chain.uptoProxy,
  uptoTimeoutSeconds: limits.uptoTimeoutSeconds,
  soloSettleFloor: limits.soloSettleFloor,
  paymentCap: limits.paymentCap
})

/**
 * Checks a direct x402 payment before any provider work: it only reads (signature recovery, the nonce's
 * state on chain, the payer's balance and, for `upto`, its Permit2 allowance) and never submits, so every
 * rejection moves no money. Each rejection is a 402 carrying fresh `accepts`, so the client can sign
 * again. A nonce already seen here is refused by the reservation that follows (`Ledger.reserveX402`:
 * the primary key of `x402_authorizations` fails its one statement), which every caller makes before
 * anything is served or settled.
 */
export class PaymentVerifier extends Context.Service<
  PaymentVerifier,
  {
    readonly settings: X402Settings
    /** The 402 for a request that arrived without a payment. */
    readonly quote: (input: QuoteInput) => PaymentRequired
    /** An `exact` payment only (deposits): an `upto` one is `wrong_scheme`. */
    readonly verifyExact: (input: VerifyExactInput) => Effect.Effect<VerifiedExact, PaymentRequired>
    /** `exact`, or `upto` where the surface takes it. */
    readonly verify: (input: VerifyInput) => Effect.Effect<VerifiedPayment, PaymentRequired>
    /**
     * As `verify`, answered once the signature and the terms passed, with the chain's reads still in
     * flight: the paid path reserves while they travel (D543).
     */
    readonly start: (input: VerifyInput) => Effect.Effect<StartedPayment, PaymentRequired>
  }
>()("router/payment/PaymentVerifier") {
  static readonly layer = Layer.effect(
    PaymentVerifier,
    Effect.gen(function* () {
      const chain = yield* Chain
      const settings = x402Settings(chain, yield* X402Config)

      const quote = (input: QuoteInput) =>
        paymentRequired({ settings, ...input, error: "payment required: sign the quoted maximum" })

      const rejecter =
        (input: VerifyInput) =>
        (
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
                  upto: input.upto,
                  code,
                  error,
                  ...extra
                })
              )
            )
          )

      /**
       * Every field the envelope names is the quote's: a signature valid for the real token under an
       * envelope naming another asset or recipient is refused, before anything is reserved.
       */
      const envelopeNamesQuote = ({ asset, payTo }: ExactPayment | UptoPayment): string | undefined =>
        asset !== undefined && asset.toLowerCase() !== settings.asset.toLowerCase()
          ? `accepted.asset must be the quoted token ${settings.asset} on ${settings.network}`
          : payTo !== undefined && payTo.toLowerCase() !== settings.payTo.toLowerCase()
            ? `accepted.payTo must be the treasury ${settings.payTo}`
            : undefined

      /** The call's carried check when it is of this header, else the check itself. */
      const signedBy = (input: VerifyInput, payment: ExactPayment | UptoPayment) =>
        input.signed !== undefined && input.signed.header === input.header
          ? Effect.succeed(input.signed.valid)
          : paymentSigned(chain, payment)

      const nowSeconds = Effect.map(Clock.currentTimeMillis, (ms) => BigInt(Math.floor(ms / 1000)))
      const skew = BigInt(PAYMENT_CLOCK_SKEW_S)

      // What the chain showed of each payer's funds, for `vouched` (D543).
      const seen = fundsSeen()
      const remember = (key: string, funds: bigint) =>
        Effect.map(Clock.currentTimeMillis, (nowMs) => seen.remember(key, funds, nowMs))
      const vouches = (key: string, value: bigint) =>
        Effect.map(Clock.currentTimeMillis, (nowMs) => seen.vouches(key, value, nowMs))

      const checkExact = Effect.fnUntraced(function* (input: VerifyInput, payment: ExactPayment) {
        const rejectWith = rejecter(input)
        const { network, authorization, signature } = payment
        const { from, to, value, validAfter, validBefore, nonce } = authorization
        yield* Effect.annotateCurrentSpan({ "payment.payer": from, "payment.value": value.toString() })

        if (network !== settings.network) {
          return yield* rejectWith("payment_invalid", `network must be ${settings.network}`)
        }
        const named = envelopeNamesQuote(payment)
        if (named !== undefined) return yield* rejectWith("payment_invalid", named)
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

        const now = yield* nowSeconds
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
        // Signature recovery is CPU work and the two reads are I/O: start the reads, send them at once
        // (not at the end of this turn, which comes after the check, D382) and check the signature
        // while they are in flight (this is on every paid call's first-byte path). A nonce
        // this router has seen is refused by the reservation's own statement (the primary key of
        // `x402_authorizations`, D381), not read here.
        const reads = yield* Effect.all(
          [
            chain.authorizationState(from, nonce).pipe(Effect.catch(unavailable)),
            chain.balanceOf(from).pipe(Effect.catch(unavailable))
          ],
          { concurrency: "unbounded" }
        ).pipe(Effect.forkChild({ startImmediately: true }))
        yield* chain.sendQuickReads
        if (!(yield* signedBy(input, payment))) {
          yield* Fiber.interrupt(reads)
          return yield* rejectWith(
            "payment_invalid",
            "the signature is not a TransferWithAuthorization signed by authorization.from for this token"
          )
        }
        const unread = { scheme: "exact", payer: from, value, authorization, signature, network } as const
        const payerKey = `exact:${from.toLowerCase()}`
        const started: StartedPayment = {
          payment: unread,
          onChain: Effect.flatMap(Fiber.join(reads), ([usedOnChain, balance]) =>
            Effect.andThen(
              remember(payerKey, balance),
              usedOnChain
                ? rejectWith("payment_invalid", "authorization already used")
                : balance < value
                  ? rejectWith("payment_invalid", "insufficient balance")
                  : Effect.succeed({ ...unread, balance } satisfies VerifiedExact)
            )
          ),
          cancel: Fiber.interrupt(reads),
          vouched: yield* vouches(payerKey, value)
        }
        return started
      })

      /**
       * Spec 5.2 `upto`: the Permit2 witness transfer names this token, the upto proxy as spender, the
       * treasury as `witness.to` and the router signer as `witness.facilitator`; its ceiling covers the
       * worst case (same floor and cap as `exact`); its deadline lies 30 minutes to 2 hours ahead; it is
       * signed by `from`; its nonce is unused in Permit2's bitmap (and here, by the reservation); and the payer's balance and
       * Permit2 allowance cover the ceiling.
       */
      const checkUpto = Effect.fnUntraced(function* (input: VerifyInput, payment: UptoPayment) {
        const rejectWith = rejecter(input)
        const { network, authorization, signature } = payment
        const { from, permitted, spender, nonce, deadline, witness } = authorization
        const ceiling = permitted.amount
        yield* Effect.annotateCurrentSpan({
          "payment.scheme": "upto",
          "payment.payer": from,
          "payment.value": ceiling.toString()
        })

        if (network !== settings.network) {
          return yield* rejectWith("payment_invalid", `network must be ${settings.network}`)
        }
        const named = envelopeNamesQuote(payment)
        if (named !== undefined) return yield* rejectWith("payment_invalid", named)
        if (permitted.token !== settings.asset) {
          return yield* rejectWith("payment_invalid", `permitted.token must be the asset ${settings.asset}`)
        }
        if (spender !== settings.uptoProxy) {
          return yield* rejectWith(
            "payment_invalid",
            `spender must be the x402 upto proxy ${settings.uptoProxy}`
          )
        }
        if (witness.to !== settings.payTo) {
          return yield* rejectWith("payment_invalid", `witness.to must be the treasury ${settings.payTo}`)
        }
        if (witness.facilitator !== settings.facilitator) {
          return yield* rejectWith(
            "payment_invalid",
            `witness.facilitator must be the router ${settings.facilitator} (extra.facilitatorAddress)`
          )
        }
        if (ceiling < BigInt(settings.soloSettleFloor)) {
          return yield* rejectWith(
            "solo_settle_floor",
            `the signed amount is below the solo settlement floor of ${settings.soloSettleFloor} base units`
          )
        }
        if (ceiling < BigInt(input.worstCase)) {
          return yield* rejectWith("payment_invalid", "signed amount below the quoted maximum")
        }

        const now = yield* nowSeconds
        if (witness.validAfter > now + skew) {
          return yield* rejectWith("payment_invalid", "witness.validAfter has not passed yet")
        }
        if (deadline < now + BigInt(UPTO_MIN_DEADLINE_S) - skew) {
          return yield* rejectWith(
            "payment_invalid",
            `the deadline must be at least ${UPTO_MIN_DEADLINE_S} seconds ahead`
          )
        }
        if (deadline > now + BigInt(UPTO_MAX_DEADLINE_S) + skew) {
          return yield* rejectWith(
            "payment_invalid",
            `the deadline must be at most ${UPTO_MAX_DEADLINE_S} seconds ahead`
          )
        }

        const unavailable = () =>
          rejectWith(
            "payment_verification_unavailable",
            "the payer's on-chain state could not be read; the signature was not rejected",
            { retryable: true }
          )
        const nonceKey = uptoNonceKey(nonce)
        const reads = yield* Effect.all(
          [
            chain.permit2NonceUsed(from, nonce).pipe(Effect.catch(unavailable)),
            chain.balanceOf(from).pipe(Effect.catch(unavailable)),
            chain.permit2Allowance(from).pipe(Effect.catch(unavailable))
          ],
          { concurrency: "unbounded" }
        ).pipe(Effect.forkChild({ startImmediately: true }))
        yield* chain.sendQuickReads
        if (!(yield* signedBy(input, payment))) {
          yield* Fiber.interrupt(reads)
          return yield* rejectWith(
            "payment_invalid",
            "the signature is not a Permit2 PermitWitnessTransferFrom signed by permit2Authorization.from"
          )
        }
        const unread = {
          scheme: "upto",
          payer: from,
          value: ceiling,
          authorization,
          signature,
          network,
          nonceKey
        } as const
        const payerKey = `upto:${from.toLowerCase()}`
        const started: StartedPayment = {
          payment: unread,
          onChain: Effect.flatMap(Fiber.join(reads), ([usedOnChain, balance, allowance]) =>
            Effect.andThen(
              // biome-ignore lint/complexity/useMathMinMax: bigints, which Math.min does not take
              remember(payerKey, balance < allowance ? balance : allowance),
              usedOnChain
                ? rejectWith("payment_invalid", "authorization already used")
                : balance < ceiling
                  ? rejectWith("payment_invalid", "insufficient balance")
                  : allowance < ceiling
                    ? rejectWith(
                        "payment_invalid",
                        "the payer's Permit2 allowance is below the ceiling: approve Permit2 for the token once (createPermit2ApprovalTx)"
                      )
                    : Effect.succeed({ ...unread, balance } satisfies VerifiedUpto)
            )
          ),
          cancel: Fiber.interrupt(reads),
          vouched: yield* vouches(payerKey, ceiling)
        }
        return started
      })

      const start = Effect.fnUntraced(function* (input: VerifyInput) {
        const rejectWith = rejecter(input)
        if (input.worstCase > settings.paymentCap) {
          return yield* rejectWith("payment_limit", "worst case above the payment cap")
        }
        const decoded = decodePaymentSignature(input.header, input.upto ? ["exact", "upto"] : ["exact"])
        if (Result.isFailure(decoded)) {
          const { reason, message } = decoded.failure
          return yield* rejectWith(
            reason === "unsupported_scheme" ? "wrong_scheme" : "payment_invalid",
            message
          )
        }
        const payment = decoded.success
        return payment.scheme === "exact"
          ? yield* checkExact(input, payment)
          : yield* checkUpto(input, payment)
      }, traced("PaymentVerifier.start"))

      const verify = (input: VerifyInput) => Effect.flatMap(start(input), (started) => started.onChain)

      const verifyExact = (input: VerifyExactInput) =>
        verify({ ...input, upto: false }).pipe(
          Effect.flatMap((payment) =>
            payment.scheme === "exact"
              ? Effect.succeed(payment)
              : Effect.die("an upto payment passed as exact")
          )
        )

      return PaymentVerifier.of({ settings, quote, verify, start, verifyExact })
    })
  )
}
