/**
 * Standing quotes kept in quote id order. An auction lists its exclusions by quote id; handed the book in
 * that order it lists them as they come instead of sorting a thousand strings per request (D282). The
 * order is kept as quotes come and go: a binary search and one array move each.
 */
import type { SignedQuote } from "../domain/Quote.ts"

export interface Standing {
  /** The book's key of the quote's (provider, class). */
  readonly key: string
  readonly quote: SignedQuote
  /** The book's number for the quote's provider (`LiveQuote.provider`). */
  readonly provider: number
}

export class QuotesById {
  readonly #entries: Array<Standing> = []

  get all(): ReadonlyArray<Standing> {
    return this.#entries
  }

  /** The first position whose quote id is not below `id`. */
  #lowerBound(id: string): number {
    let low = 0
    let high = this.#entries.length
    while (low < high) {
      const mid = (low + high) >>> 1
      if (this.#entries[mid]!.quote.quote_id < id) low = mid + 1
      else high = mid
    }
    return low
  }

  add(key: string, quote: SignedQuote, provider: number): void {
    this.#entries.splice(this.#lowerBound(quote.quote_id), 0, { key, quote, provider })
  }

  remove(quote: SignedQuote): void {
    for (let i = this.#lowerBound(quote.quote_id); i < this.#entries.length; i++) {
      const held = this.#entries[i]!.quote
      if (held === quote) {
        this.#entries.splice(i, 1)
        return
      }
      if (held.quote_id !== quote.quote_id) return
    }
  }
}
