import { charge, feeSplit, ROUTER_FEE_BPS, type Tariff, type TokenCounts } from "../domain/Billing.ts"
import type { Economics } from "../domain/Economics.ts"
import type { ReceiptBody } from "../domain/Receipt.ts"
import { type AuctionCleared, type RankedBid, rivalCounterfactuals } from "../market/Auction.ts"

/** How a receipt names what paid: a funded key, a session's budget, or an x402 authorization. */
export type PaidBy =
  | { readonly _tag: "X402"; readonly scheme?: "exact" | "upto" }
  | { readonly _tag: "Credit"; readonly keyId: string }
  | { readonly _tag: "Session"; readonly sessionId: string }

/** A receipt's `payment_ref` before settlement: the key or the session; an x402 transfer has no hash yet. */
export const paymentRefOf = (paidBy: PaidBy): string =>
  paidBy._tag === "Credit"
    ? `credit:${paidBy.keyId}`
    : paidBy._tag === "Session"
      ? `session:${paidBy.sessionId}`
      : ""

export interface ReceiptFacts {
  readonly requestId: string
  /** Unix milliseconds. */
  readonly createdAt: number
  readonly epochId: number
  readonly payer: string
  readonly providerId: string
  readonly modelClass: string
  readonly tokens: TokenCounts
  readonly tariff: Tariff
  readonly charged: number
  readonly authorized: number
  readonly paymentRef: string
  /** Whether the charge is settled as it is captured (a balance or a budget) or waits for a transfer. */
  readonly settledOnCapture: boolean
  /** Nothing will move for it (an `upto` authorization charged zero): settlement `none`. */
  readonly settlesNothing?: boolean
  readonly status: ReceiptBody["status"]
  readonly ttftMs: number
  readonly sessionId: string | null
  readonly quotesCompeting: number
}

/** The one builder of a receipt (spec 2.8): no prompt, no reply, every figure recomputable from the tariff. */
export const receiptOf = (facts: ReceiptFacts): ReceiptBody => ({
  request_id: facts.requestId,
  wallet: facts.payer.toLowerCase(),
  provider_id: facts.providerId,
  model_class: facts.modelClass,
  in_tokens: facts.tokens.input,
  out_tokens: facts.tokens.output,
  cached_tokens: facts.tokens.cachedInput,
  price_in: facts.tariff.price_in,
  price_out: facts.tariff.price_out,
  price_in_cached: facts.tariff.price_in_cached ?? null,
  charged: facts.charged,
  authorized: facts.authorized,
  payment_ref: facts.paymentRef,
  refund_ref: null,
  ttft_ms: facts.ttftMs,
  status: facts.status,
  settlement:
    facts.status === "released" || facts.settlesNothing === true
      ? "none"
      : facts.settledOnCapture
        ? "landed"
        : "pending",
  epoch_id: facts.epochId,
  session_id: facts.sessionId,
  quotes_competing: facts.quotesCompeting,
  created_at: facts.createdAt
})

/** Token requests carry their session, agent and the winner's expected latency; images their count. */
export type EconomicsDetail =
  | { readonly _tag: "Tokens"; readonly sessionId: string | null; readonly agent: Record<string, string> }
  | { readonly _tag: "Images"; readonly images: number; readonly unit: string }

export interface EconomicsFacts {
  readonly requestId: string
  readonly auction: AuctionCleared
  /** The bid that served (the winner, or the fallback that replaced it). */
  readonly servedBy: RankedBid
  readonly tokens: TokenCounts
  readonly charged: number
  readonly authorized: number
  readonly ttftMs: number
  readonly detail: EconomicsDetail
}

export const TOKEN_PRICE_UNIT = "base units (6 decimals); prices per 1,000,000 tokens"

/** The one builder of the economics record: own ask, clearing, rivals' counterfactuals, fee split. */
export const economicsOf = (facts: EconomicsFacts): Economics => {
  const { auction, servedBy, tokens, charged, detail } = facts
  const ownAsk = charge(tokens, servedBy)
  const { routerFee, providerShare } = feeSplit(charged)
  return {
    request_id: facts.requestId,
    version: auction.version,
    mechanism: auction.mechanism,
    profile: auction.profile,
    unit: detail._tag === "Images" ? detail.unit : TOKEN_PRICE_UNIT,
    ...(detail._tag === "Images" ? { images: detail.images } : {}),
    tokens: { input: tokens.input, cached_input: tokens.cachedInput, output: tokens.output },
    winner: {
      provider: servedBy.provider_id,
      model: servedBy.model_class,
      own_ask: { price_in: servedBy.price_in, price_out: servedBy.price_out },
      own_ask_charge: ownAsk
    },
    clear: { price_in: auction.clear.price_in, price_out: auction.clear.price_out },
    price_setter: auction.priceSetter,
    charged,
    authorized: facts.authorized,
    second_score_premium: Math.max(0, charged - ownAsk),
    competitors: rivalCounterfactuals(auction.bids, tokens),
    quotes_competing: auction.eligible,
    ...(detail._tag === "Tokens" ? { session_id: detail.sessionId, agent: detail.agent } : {}),
    latency:
      detail._tag === "Tokens"
        ? {
            ttft_ms: facts.ttftMs,
            winner_expected_ttft_ms: Math.round(servedBy.score_breakdown.latency_ms),
            winner_latency_penalty: servedBy.score_breakdown.latency_penalty
          }
        : { ttft_ms: facts.ttftMs },
    fee_split: {
      router_fee_bps: ROUTER_FEE_BPS,
      router_fee: routerFee,
      provider_share: providerShare,
      total: routerFee + providerShare
    }
  }
}
