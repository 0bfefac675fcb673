import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import {
  countTokens,
  EndOfPrompt,
  EndOfText,
  FimMiddle,
  FimPrefix,
  FimSuffix,
  ImEnd,
  ImSep,
  ImStart
} from "gpt-tokenizer/encoding/o200k_base"
import { countTextTokens, estimatePromptTokens } from "../../src/inference/Tokens.ts"
import { fundedKey } from "../support/Keys.ts"
import { waitForQuote } from "../support/Pay.ts"
import { call, postJson, routerWithFleet } from "../support/Router.ts"

/**
 * Token counts (D554): a special token's spelling in a caller's text is text. The tokenizer's default throws on
 * it, which made a prompt quoting `<|endoftext|>` a 500 and a reply quoting one a failed meter.
 */
const SPECIAL = [EndOfText, EndOfPrompt, FimPrefix, FimMiddle, FimSuffix, ImStart, ImEnd, ImSep]
const PLAIN = { disallowedSpecial: new Set<string>() }

/** Text with special tokens' spellings among ordinary pieces, some long enough to be counted in windows. */
const text = fc
  .array(
    fc.oneof(
      fc.string({ unit: "grapheme", maxLength: 40 }),
      fc.constantFrom(...SPECIAL),
      fc.constantFrom(" ", "\n", "x".repeat(3000), "word ".repeat(700))
    ),
    { maxLength: 12 }
  )
  .map((pieces) => pieces.join(""))

describe("token counts", () => {
  it("count any text, special tokens' spellings included, as plain text, never below the whole count (property)", () => {
    fc.assert(
      fc.property(text, (t) => {
        const counted = countTextTokens(t)
        const whole = countTokens(t, PLAIN)
        // Cut in windows, a long text may count a token more at a cut, never fewer (the authorizing side).
        assert.isAtLeast(counted, whole)
        if (t.length <= 2048) assert.strictEqual(counted, whole)
      }),
      { numRuns: 300 }
    )
  })

  it("price a prompt that quotes every special token", () => {
    const content = `What do ${SPECIAL.join(", ")} mean?`
    const estimate = estimatePromptTokens([{ role: "user", content }])
    assert.strictEqual(estimate, 3 + 4 + countTokens(content, PLAIN))
  })
})

describe("a paid call quoting a special token", () => {
  layer(routerWithFleet(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("is served and charged like any other", () =>
      Effect.gen(function* () {
        yield* waitForQuote("chat-small")
        const key = yield* fundedKey({ budget: 100_000_000, balance: 100_000_000 })
        const reply = yield* postJson(
          "/v1/chat/completions",
          {
            model: "chat-small",
            messages: [{ role: "user", content: "Repeat after me: <|endoftext|> and <|im_start|>" }],
            max_tokens: 16
          },
          { "x-credit-key": key.secret }
        )
        assert.strictEqual(reply.status, 200, reply.text)
        const body = JSON.parse(reply.text) as {
          usage: { prompt_tokens: number }
          svc: { status: string; links: { receipt: string } }
        }
        assert.strictEqual(body.svc.status, "ok")
        assert.isAbove(body.usage.prompt_tokens, 0)
        const receipt = yield* call(body.svc.links.receipt)
        assert.strictEqual(receipt.status, 200, receipt.text)
        assert.isAbove((JSON.parse(receipt.text) as { receipt: { charged: number } }).receipt.charged, 0)
      })
    )
  })
})
