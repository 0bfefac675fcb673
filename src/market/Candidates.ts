/**
 * The eligible quotes of one auction as parallel typed arrays, candidate `i` across them (D280): a
 * score is computed once and compared as a number. `score` is cost x multiplier when that is a safe
 * integer (then exact); otherwise NaN there and the exact bigint in `wideScores`.
 *
 * The arrays outlive the auction (D302): an auction is synchronous, so the next one takes the same
 * buffers (`Candidates.take`, `release`) instead of allocating a dozen kilobytes of typed arrays per
 * request. One begun while another holds them (a latency lookup that ran an auction) gets its own, and
 * an auction that throws leaves them to be garbage. Released candidates hold no reference to a quote.
 */
import type { SignedQuote } from "../domain/Quote.ts"
import type { LiveQuote, RankedBid, ScoreBreakdown } from "./AuctionRecords.ts"
import type { LatencyEstimate, Maturity } from "./LatencyStats.ts"
import type { ProfileWeights } from "./Route.ts"
import {
  type ClassTerms,
  compareStrings,
  latencyPenalty,
  multiplierBps,
  SCORING_LATENCY_QUANTILE
} from "./Scoring.ts"

const MATURITIES: ReadonlyArray<Maturity> = ["cold", "warming", "mature"]
const maturityCode = (maturity: Maturity): number =>
  maturity === "mature" ? 2 : maturity === "warming" ? 1 : 0
const NO_QUOTES: ReadonlyArray<LiveQuote> = []

/** The buffers of the last auction, free for the next one. */
let spare: Candidates | undefined

export class Candidates {
  n = 0
  /** The auction's input: candidate `i` is `input[position[i]]`. */
  input: ReadonlyArray<LiveQuote> = NO_QUOTES
  /** Per input quote: the auction's code for it (Auction.ts: out of scope, competing, or why not). */
  readonly codes: Uint8Array
  /** The candidate's index in the auction's input (where its exclusion, if any, is written). */
  readonly position: Int32Array
  /** The candidate's provider number (`LiveQuote.provider`, or the auction's own: `numberProviders`). */
  readonly provider: Int32Array
  /** One more than the largest provider number; -1 once a candidate came without a usable one. */
  providerBound = 0
  /** The candidate's class terms (the few of one auction; replaced, not cleared, by the next). */
  readonly terms: Array<ClassTerms | undefined>
  /** 1 for the session's locked quote. */
  readonly locked: Uint8Array
  /** The latency estimate's maturity (index in MATURITIES). */
  readonly maturity: Uint8Array
  readonly cost: Float64Array
  readonly multiplier: Float64Array
  readonly score: Float64Array
  readonly latencyMs: Float64Array
  readonly latencyPenalty: Float64Array
  /** The exact scores that pass 2^53, by candidate (rare: made only when one does). */
  wideScores: Map<number, bigint> | undefined

  readonly capacity: number

  private constructor(capacity: number) {
    this.capacity = capacity
    this.codes = new Uint8Array(capacity)
    this.position = new Int32Array(capacity)
    this.provider = new Int32Array(capacity)
    this.terms = new Array<ClassTerms | undefined>(capacity).fill(undefined)
    this.locked = new Uint8Array(capacity)
    this.maturity = new Uint8Array(capacity)
    this.cost = new Float64Array(capacity)
    this.multiplier = new Float64Array(capacity)
    this.score = new Float64Array(capacity)
    this.latencyMs = new Float64Array(capacity)
    this.latencyPenalty = new Float64Array(capacity)
  }

  /** Empty candidates for an auction over `input`, every code 0. */
  static take(input: ReadonlyArray<LiveQuote>): Candidates {
    const reused = spare !== undefined && spare.capacity >= input.length ? spare : undefined
    const candidates = reused ?? new Candidates(input.length)
    spare = undefined
    candidates.input = input
    candidates.codes.fill(0, 0, input.length)
    return candidates
  }

  /** Hands the buffers to the next auction; the candidates must not be read after. */
  release(): void {
    this.n = 0
    this.input = NO_QUOTES
    this.providerBound = 0
    this.wideScores = undefined
    if (spare === undefined || spare.capacity < this.capacity) spare = this
  }

  quoteOf(i: number): SignedQuote {
    return this.input[this.position[i]!]!.quote
  }

  termsOf(i: number): ClassTerms {
    return this.terms[i]!
  }

  /** Scores a quote that passed eligibility and adds it; returns its candidate index. */
  add(
    position: number,
    terms: ClassTerms,
    cost: number,
    estimate: LatencyEstimate,
    locked: boolean,
    weights: ProfileWeights
  ): number {
    const i = this.n++
    const provider = this.input[position]!.provider
    if (provider !== undefined && (provider | 0) === provider && provider >= 0 && this.providerBound >= 0) {
      this.provider[i] = provider
      if (provider >= this.providerBound) this.providerBound = provider + 1
    } else this.providerBound = -1
    const latencyMs = Math.round(estimate.quantile(SCORING_LATENCY_QUANTILE))
    const penalty = latencyPenalty(latencyMs)
    const multiplier = multiplierBps(weights, terms.qualityPenalty, penalty)
    const product = cost * multiplier
    this.position[i] = position
    this.terms[i] = terms
    this.locked[i] = locked ? 1 : 0
    this.maturity[i] = maturityCode(estimate.maturity)
    this.cost[i] = cost
    this.multiplier[i] = multiplier
    if (Number.isSafeInteger(product)) this.score[i] = product
    else {
      this.score[i] = Number.NaN
      if (this.wideScores === undefined) this.wideScores = new Map()
      this.wideScores.set(i, BigInt(cost) * BigInt(multiplier))
    }
    this.latencyMs[i] = latencyMs
    this.latencyPenalty[i] = penalty
    return i
  }

  /**
   * Makes the provider numbers dense enough to index an array by: the book's when every candidate came
   * with one and they stay below a few per candidate, else numbers by provider id, in order of first sight.
   */
  numberProviders(): void {
    if (this.providerBound >= 0 && this.providerBound <= 4 * this.n + 64) return
    const numbers = new Map<string, number>()
    for (let i = 0; i < this.n; i++) {
      const id = this.quoteOf(i).provider_id
      let number = numbers.get(id)
      if (number === undefined) {
        number = numbers.size
        numbers.set(id, number)
      }
      this.provider[i] = number
    }
    this.providerBound = numbers.size
  }

  /** The exact score (cost x multiplier) of candidate `i`. */
  exactScore(i: number): bigint {
    return this.wideScores?.get(i) ?? BigInt(this.score[i]!)
  }

  /** Total order: score, then own cost, then quote id, then provider id. */
  compare(a: number, b: number): number {
    const sa = this.score[a]!
    const sb = this.score[b]!
    let byScore: number
    if (Number.isNaN(sa) || Number.isNaN(sb)) {
      const wa = this.exactScore(a)
      const wb = this.exactScore(b)
      byScore = wa < wb ? -1 : wa > wb ? 1 : 0
    } else byScore = sa - sb
    if (byScore !== 0) return byScore
    const byCost = this.cost[a]! - this.cost[b]!
    if (byCost !== 0) return byCost
    const qa = this.quoteOf(a)
    const qb = this.quoteOf(b)
    return compareStrings(qa.quote_id, qb.quote_id) || compareStrings(qa.provider_id, qb.provider_id)
  }

  breakdown(i: number): ScoreBreakdown {
    const terms = this.terms[i]!
    const breakdown = {
      cost: this.cost[i]!,
      quality: terms.quality,
      quality_penalty: terms.qualityPenalty,
      latency_ms: this.latencyMs[i]!,
      latency_quantile: SCORING_LATENCY_QUANTILE,
      latency_penalty: this.latencyPenalty[i]!,
      maturity: MATURITIES[this.maturity[i]!]!,
      multiplier_bps: this.multiplier[i]!
    }
    return terms.taskFit === undefined ? breakdown : { ...breakdown, task_fit: terms.taskFit }
  }

  toBid(i: number, index: number): RankedBid {
    const quote = this.quoteOf(i)
    const raw = this.score[i]!
    const score = (Number.isNaN(raw) ? Number(this.exactScore(i)) : raw) / 10_000
    const outcome = index === 0 ? "won" : "lost"
    // One object literal per shape (with or without a cached price), keys in the published order.
    return quote.price_in_cached === undefined
      ? {
          rank: index + 1,
          quote_id: quote.quote_id,
          provider_id: quote.provider_id,
          model_class: quote.model_class,
          price_in: quote.price_in,
          price_out: quote.price_out,
          score,
          score_breakdown: this.breakdown(i),
          outcome
        }
      : {
          rank: index + 1,
          quote_id: quote.quote_id,
          provider_id: quote.provider_id,
          model_class: quote.model_class,
          price_in: quote.price_in,
          price_out: quote.price_out,
          price_in_cached: quote.price_in_cached,
          score,
          score_breakdown: this.breakdown(i),
          outcome
        }
  }
}
