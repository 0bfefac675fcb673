import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import fc from "fast-check"
import { SignedQuote } from "../../src/domain/Quote.ts"
import { QuotesById } from "../../src/market/QuotesById.ts"

const quote = (id: string, provider: string) =>
  Schema.decodeUnknownSync(SignedQuote)({
    quote_id: id,
    provider_id: provider,
    model_class: "chat-small",
    price_in: 1,
    price_out: 1,
    max_context: 1_000,
    valid_until: 1,
    capacity_rps: 1,
    sig: `0x${"ab".repeat(65)}`
  })

describe("QuotesById", () => {
  it("holds exactly the quotes added and not removed, in quote id order, whatever the order of changes", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            add: fc.boolean(),
            id: fc.stringMatching(/^[A-Za-z0-9._:-]{1,6}$/),
            pick: fc.nat()
          }),
          { maxLength: 80 }
        ),
        (steps) => {
          const book = new QuotesById()
          const held: Array<SignedQuote> = []
          steps.forEach(({ add, id, pick }, i) => {
            if (add || held.length === 0) {
              // Ids may repeat (two providers can sign the same id): each quote is its own entry.
              const q = quote(id, `p-${i}`)
              book.add(`k-${i}`, q, i)
              held.push(q)
            } else {
              const [gone] = held.splice(pick % held.length, 1)
              book.remove(gone!)
            }
          })
          const ids = book.all.map((e) => e.quote.quote_id)
          assert.deepStrictEqual(
            ids,
            [...ids].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
          )
          assert.sameMembers(
            book.all.map((e) => e.quote),
            held
          )
        }
      ),
      { numRuns: 300 }
    )
  })
})
