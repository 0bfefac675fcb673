import { Clock, Context, Effect, Layer } from "effect"
import {
  Conflict,
  type Forbidden,
  NotFound,
  type ServiceUnavailable,
  Unauthorized
} from "../domain/Errors.ts"
import { PaymentRequired, type PaymentRequiredCode } from "../domain/X402.ts"
import {
  type CreditRefused,
  type CreditReserved,
  type KeyRefused,
  Ledger,
  OVERCOMMITTED,
  type ReservationRecord
} from "../ledger/Ledger.ts"
import type { HeldLease } from "../market/QuoteBook.ts"
import { traced } from "../Telemetry.ts"
import { CreditKeys } from "./CreditKeys.ts"
import { creditKeyRefusal, hashSecret } from "./Keys.ts"
import type { SignatureCheck } from "./PaymentSignature.ts"
import {
  PaymentVerifier,
  type QuoteInput,
  type UnreadPayment,
  type VerifiedPayment
} from "./PaymentVerifier.ts"
import { type SessionRow, Sessions, type TurnRefusal } from "./Sessions.ts"

/** How an admitted request is paid for. */
export type Funding =
  | { readonly _tag: "X402"; readonly payment: VerifiedPayment }
  | {
      readonly _tag: "Credit"
      readonly keyId: string
      readonly wallet: string
      readonly keyRemaining: number
    }
  | { readonly _tag: "Session"; readonly sessionId: string; readonly budgetRemaining: number }

export interface Funded {
  readonly funding: Extract<Funding, { _tag: "X402" | "Credit" }>
  readonly payer: string
  /** What was reserved: the worst case (a key) or the signed value (x402). */
  readonly authorized: number
  /** The capacity lease `reservation.lease` asked for, and whether the reservation's statement took it (D311). */
  readonly lease?: HeldLease | undefined
}

/** What an x402 reservation holds of a payment; with the balance once the chain has answered (D543). */
const x402Hold = (payment: UnreadPayment, balance: bigint | undefined) => ({
  ...(payment.scheme === "exact"
    ? { nonce: payment.authorization.nonce, validAfter: payment.authorization.validAfter }
    : {
        scheme: "upto" as const,
        nonce: payment.nonceKey,
        validAfter: payment.authorization.witness.validAfter
      }),
  validBefore:
    payment.scheme === "exact" ? payment.authorization.validBefore : payment.authorization.deadline,
  signature: payment.signature,
  balance
})

export interface FundingInput<E> {
  readonly creditKey: string | undefined
  readonly paymentHeader: string | undefined
  /** The header's signature check when the call made it already (`PaidRequestContext.signed`). */
  readonly signed?: SignatureCheck | undefined
  readonly resourceUrl: string
  readonly worstCase: number
  readonly description: string
  /** Whether `upto` is accepted besides `exact` (per-turn completions, spec 5.2); defaults to no. */
  readonly upto?: boolean
  /**
   * What the request is, minus who pays and how much. Its `lease`, if any, the reservation takes in its
   * own statement (`Funded.lease`).
   */
  readonly reservation: Omit<ReservationRecord, "payer" | "authorized">
  /** What the refusals call the thing being paid for ("the worst case of this request", "the image"). */
  readonly subject: string
  /**
   * Runs once the payer and amount are known and before anything is reserved (a session opening
   * records itself here); `undo` runs if the reservation is then refused.
   */
  readonly beforeReserve?: (
    payer: string,
    authorized: number,
    source: { readonly _tag: "X402" } | { readonly _tag: "Credit"; readonly keyId: string }
  ) => Effect.Effect<void, E>
  readonly undo?: Effect.Effect<void>
}

export interface TurnInput {
  readonly sessionId: string
  /** `x-session-token` as sent. */
  readonly token: string | undefined
  readonly worstCase: number
  readonly resourceUrl: string
  /** What the request is, minus who pays and how much. */
  readonly reservation: Omit<ReservationRecord, "payer" | "authorized" | "sessionId">
}

export interface FundedTurn {
  readonly funding: Extract<Funding, { _tag: "Session" }>
  readonly session: SessionRow
  readonly payer: string
  readonly authorized: number
}

/**
 * The one place a paid request is funded: a funded key's reservation (owner balance within
 * the key's cap, no signature), a verified x402 authorization (`exact`, or an `upto` ceiling where
 * the surface takes it) reserved against the payer's balance, or a turn of an open session drawn on its budget (one turn at a time).
 * Refusals are typed; a refusal to pay is a 402 that carries fresh `accepts`.
 */
export class FundingService extends Context.Service<
  FundingService,
  {
    readonly quote: (input: QuoteInput, code?: PaymentRequiredCode, error?: string) => PaymentRequired
    readonly fund: <E = never>(
      input: FundingInput<E>
    ) => Effect.Effect<Funded, PaymentRequired | Unauthorized | Forbidden | ServiceUnavailable | E>
    /** Takes the session for one turn and reserves the turn's worst case on its budget. */
    readonly fundTurn: (
      input: TurnInput
    ) => Effect.Effect<FundedTurn, PaymentRequired | Unauthorized | NotFound | Conflict | ServiceUnavailable>
  }
>()("router/payment/Funding") {
  static readonly layer = Layer.effect(
    FundingService,
    Effect.gen(function* () {
      const verifier = yield* PaymentVerifier
      const ledger = yield* Ledger
      const creditKeys = yield* CreditKeys
      const sessions = yield* Sessions

      const quote = (input: QuoteInput, code?: PaymentRequiredCode, error?: string) => {
        const { _tag, ...body } = verifier.quote(input)
        return new PaymentRequired({
          ...body,
          ...(code === undefined ? {} : { code }),
          ...(error ? { error } : {})
        })
      }

      const fund = <E = never>(input: FundingInput<E>) =>
        Effect.gen(function* () {
          // The lease the reservation's statement was asked to take, and whether it did (D311).
          const leaseOf = (granted: boolean | undefined): HeldLease | undefined => {
            const lease = input.reservation.lease
            return lease === undefined ? undefined : { lease, granted: granted === true }
          }
          const refuse = (code: PaymentRequiredCode, error: string) =>
            Effect.andThen(input.undo ?? Effect.void, Effect.fail(quote(input, code, error)))
          if (input.creditKey !== undefined) {
            const authorized = input.worstCase
            const beforeReserve = input.beforeReserve
            const refused = (
              reservation: Effect.Effect<CreditReserved, KeyRefused | CreditRefused | ServiceUnavailable>
            ) =>
              reservation.pipe(
                Effect.catchTags({
                  KeyRefused: (refused) =>
                    Effect.andThen(input.undo ?? Effect.void, Effect.fail(creditKeyRefusal(refused.reason))),
                  CreditRefused: (refused) =>
                    refuse(
                      refused.code,
                      refused.code === "key_budget_exhausted"
                        ? `this key's budget cannot cover ${input.subject}`
                        : `the key owner's credit balance cannot cover ${input.subject}`
                    )
                })
              )
            // The paid path's case: the key is resolved by the reservation's own statement. A session
            // opening records its session (which names the key and its owner) before reserving.
            const { keyId, wallet, keyRemaining, leaseGranted } =
              beforeReserve === undefined
                ? yield* refused(
                    ledger.reserveCreditKey(
                      { ...input.reservation, authorized },
                      hashSecret(input.creditKey),
                      yield* Clock.currentTimeMillis
                    )
                  )
                : yield* Effect.flatMap(creditKeys.resolve(input.creditKey), (key) =>
                    Effect.andThen(
                      beforeReserve(key.wallet, authorized, { _tag: "Credit", keyId: key.keyId }),
                      refused(
                        ledger.reserveCredit(
                          { ...input.reservation, payer: key.wallet, authorized },
                          key.keyId
                        )
                      )
                    )
                  )
            return {
              funding: { _tag: "Credit", keyId, wallet, keyRemaining },
              payer: wallet,
              authorized,
              lease: leaseOf(leaseGranted)
            } satisfies Funded
          }
          if (input.paymentHeader === undefined) return yield* Effect.fail(quote(input))
          const started = yield* verifier.start({
            header: input.paymentHeader,
            worstCase: input.worstCase,
            resourceUrl: input.resourceUrl,
            description: input.description,
            upto: input.upto === true,
            signed: input.signed
          })
          // A payer the chain showed funded within the minute reserves while the chain's reads travel
          // (D543); the chain's verdict is taken before anything is served. Any other payer (one not seen,
          // one whose funds fell short), and a session opening, which records its session before it
          // reserves, wait for the reads first, and the reservation checks the balance they read: a
          // signature over an empty wallet writes nothing and holds no provider's slot.
          const beforeReserve = input.beforeReserve
          const verifiedFirst =
            beforeReserve === undefined && started.vouched ? undefined : yield* started.onChain
          const payment: UnreadPayment = verifiedFirst ?? started.payment
          // `upto`: the ceiling is reserved (and committed against the balance); the actual is settled.
          const authorized = Number(payment.value)
          yield* beforeReserve?.(payment.payer, authorized, { _tag: "X402" }) ?? Effect.void
          const reservation = { ...input.reservation, payer: payment.payer, authorized }
          const reserved = yield* ledger
            .reserveX402(reservation, x402Hold(payment, verifiedFirst?.balance))
            .pipe(
              Effect.onError(() => started.cancel),
              Effect.catchTag("NonceReplay", (refused) => refuse("payment_invalid", refused.refusal))
            )
          const funded = (verified: VerifiedPayment) =>
            ({
              funding: { _tag: "X402", payment: verified },
              payer: verified.payer,
              authorized,
              lease: leaseOf(reserved.leaseGranted)
            }) satisfies Funded
          if (verifiedFirst !== undefined) return funded(verifiedFirst)
          // Refused by the chain, or beyond a balance the payer's unsettled authorizations already hold
          // (the reservation's guard, D327, with the balance known only now): the reservation is withdrawn.
          const withdraw = ledger.withdrawX402(reservation.requestId, payment.payer, reservation.lease)
          const verified = yield* started.onChain.pipe(Effect.onError(() => withdraw))
          if (reserved.outstanding > verified.balance) {
            yield* withdraw
            return yield* refuse("payment_invalid", OVERCOMMITTED)
          }
          return funded(verified)
        })

      /** Why a turn could not take its session, as the spec answers it. */
      const turnRefused = (refusal: TurnRefusal, input: TurnInput) => {
        const sessionQuote = (code: PaymentRequiredCode, error: string, hint: string) => {
          const { _tag, ...body } = verifier.quote({
            worstCase: input.worstCase,
            resourceUrl: input.resourceUrl,
            description: "session"
          })
          return new PaymentRequired({ ...body, code, error, hint })
        }
        switch (refusal._tag) {
          case "Unknown":
            return new NotFound({ code: "session_not_found", message: `No session ${input.sessionId}` })
          case "BadToken":
            return new Unauthorized({
              code: "invalid_session_token",
              message: "Missing or invalid x-session-token"
            })
          case "Busy":
            return new Conflict({
              code: "session_used",
              message:
                "Another request is in flight on this session; retry when it ends or rotate the session"
            })
          case "Closed":
          case "Expired":
            return new Conflict({
              code: "session_used",
              message: `The session is ${refusal._tag === "Closed" ? "closed" : "expired"}; open a new session id`
            })
          case "Dead":
            return sessionQuote(
              "session_dead",
              "the session's funding settlement failed; no further turns",
              "open a new session"
            )
          case "Exhausted":
            return sessionQuote(
              "session_budget_exhausted",
              `the session has ${refusal.remaining} base units left, less than this turn's worst case ${input.worstCase}`,
              "close the session and open a new one with a larger budget"
            )
        }
      }

      const fundTurn = Effect.fnUntraced(function* (input: TurnInput) {
        const { sessionId, worstCase } = input
        const taken = yield* sessions
          .takeTurn(sessionId, input.token, input.reservation.requestId, worstCase)
          .pipe(Effect.mapError((refusal) => turnRefused(refusal, input)))
        yield* ledger.reserveSessionTurn({
          ...input.reservation,
          payer: taken.payer,
          authorized: worstCase,
          sessionId
        })
        return {
          funding: { _tag: "Session", sessionId, budgetRemaining: taken.budget - taken.spent - worstCase },
          session: taken,
          payer: taken.payer,
          authorized: worstCase
        } satisfies FundedTurn
      }, traced("Funding.fundTurn"))

      return FundingService.of({ quote, fund, fundTurn })
    })
  )
}
