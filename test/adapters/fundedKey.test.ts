import Anthropic from "@anthropic-ai/sdk"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import OpenAI from "openai"
import { fundedKey, keySettled } from "../support/Keys.ts"
import { RouterUrl } from "../support/Router.ts"
import { adaptersRouter, dialects, servedBy, waitForBook } from "./support.ts"

/** Issue 6 item 8: the official clients, unmodified, paying with a funded key, against both dialects. */
describe("official SDKs paying with x-credit-key", () => {
  layer(adaptersRouter, { excludeTestServices: true, timeout: 120_000 })((it) => {
    for (const { dialect, model, prefix } of dialects) {
      it.effect(`responses and messages, streamed and not, served by ${dialect}-dialect providers`, () =>
        Effect.gen(function* () {
          yield* waitForBook
          const base = yield* RouterUrl
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const headers = { "x-credit-key": key.secret }
          const openai = new OpenAI({
            apiKey: "unused",
            baseURL: `${base}/v1`,
            defaultHeaders: headers,
            maxRetries: 0
          })
          const anthropic = new Anthropic({
            apiKey: "unused",
            baseURL: base,
            defaultHeaders: headers,
            maxRetries: 0
          })

          const { data: response, response: raw } = yield* Effect.promise(() =>
            openai.responses.create({ model, input: "Say hello.", max_output_tokens: 32 }).withResponse()
          )
          assert.isAbove(response.output_text.length, 0)
          assert.isNotNull(raw.headers.get("x-key-budget-remaining"))
          assert.isTrue((yield* servedBy(raw.headers.get("x-request-id")!)).provider_id.startsWith(prefix))

          const streamed = yield* Effect.promise(async () => {
            const stream = await openai.responses.create({
              model,
              input: "Stream hello.",
              max_output_tokens: 32,
              stream: true
            })
            let text = ""
            for await (const event of stream)
              if (event.type === "response.output_text.delta") text += event.delta
            return text
          })
          assert.isAbove(streamed.length, 0)

          const message = yield* Effect.promise(() =>
            anthropic.messages.create({
              model,
              max_tokens: 32,
              messages: [{ role: "user", content: "Hello?" }]
            })
          )
          assert.strictEqual(message.type, "message")
          const final = yield* Effect.promise(() =>
            anthropic.messages
              .stream({ model, max_tokens: 32, messages: [{ role: "user", content: "Stream?" }] })
              .finalMessage()
          )
          assert.isAbove(final.usage.output_tokens, 0)
          const counted = yield* Effect.promise(() =>
            anthropic.messages.countTokens({
              model,
              messages: [{ role: "user", content: "How many tokens?" }]
            })
          )
          assert.isAbove(counted.input_tokens, 0)

          const state = yield* keySettled(key.keyId)
          assert.isAbove(state.spent, 0)
          assert.strictEqual(state.reserved, 0)
          assert.strictEqual(state.available, 10_000_000 - state.spent)
        })
      )
    }
  })
})
