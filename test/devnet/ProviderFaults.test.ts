import { assert, describe, it } from "@effect/vitest"
import { Clock, Duration, Effect } from "effect"
import * as ProviderServer from "../../src/devnet/fleet/ProviderServer.ts"
import { dataLines, events, fastOptions, postAndRead, postJson, readJson } from "./sse.ts"

const chat = (content: string, extra: object = {}) => ({
  model: "chat-medium",
  messages: [{ role: "user", content }],
  stream: true,
  ...extra
})

const anthropicOptions = fastOptions({
  providerId: "sim-test-anthropic",
  dialect: "anthropic",
  modelClasses: ["chat-medium"]
})
const anthropic = (content: string) => ({
  model: "chat-medium",
  max_tokens: 512,
  messages: [{ role: "user", content }],
  stream: true
})

/**
 * The live clock, recording every sleep asked of it: a simulator served under it shows the delays it
 * scheduled, which a loaded machine cannot blur (its wall-clock times can only grow).
 */
const recordingClock = Effect.gen(function* () {
  const live = yield* Clock.Clock
  const sleeps: Array<number> = []
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: () => live.currentTimeMillisUnsafe(),
    currentTimeMillis: live.currentTimeMillis,
    currentTimeNanosUnsafe: () => live.currentTimeNanosUnsafe(),
    currentTimeNanos: live.currentTimeNanos,
    monotonicTimeNanosUnsafe: () => live.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: live.monotonicTimeNanos,
    sleep: (duration) => {
      sleeps.push(Duration.toMillis(duration))
      return live.sleep(duration)
    }
  }
  /** The sleeps scheduled since the last call. */
  const take = () => sleeps.splice(0)
  return { clock, take }
})

describe("provider faults", () => {
  it.live("[[sim:slow]] multiplies the time to first token", () =>
    Effect.gen(function* () {
      const recorded = yield* recordingClock
      const server = yield* ProviderServer.make(fastOptions({ ttftMs: 40 })).pipe(
        Effect.provideService(Clock.Clock, recorded.clock)
      )
      const url = `${server.baseUrl}/v1/chat/completions`
      const normal = yield* postAndRead(url, chat("hello"))
      const normalSleeps = recorded.take()
      const slow = yield* postAndRead(url, chat("hello [[sim:slow]]"))
      const slowSleeps = recorded.take()
      // The first token waits the time to first token: 40 ms, ten times that when slowed; the tokens after
      // it keep their pace. (What the server scheduled, not how long a loaded machine took.)
      assert.strictEqual(normalSleeps[0], 40)
      assert.strictEqual(slowSleeps[0], 400)
      assert.isTrue(
        slowSleeps.slice(1).every((ms) => ms < 40),
        String(slowSleeps)
      )
      // And the wait is real: no first byte before it (a sleep never ends early; a loaded machine only
      // makes it later).
      assert.isAtLeast(normal.firstByteMs!, 35)
      assert.isAtLeast(slow.firstByteMs!, 390)
      assert.strictEqual(dataLines(slow.text).at(-1), "[DONE]")
      assert.strictEqual(dataLines(normal.text).at(-1), "[DONE]")
      assert.strictEqual((yield* server.counters).faults.slow, 1)
    }).pipe(Effect.scoped)
  )

  it.live("[[sim:error]] answers 500 in the dialect's shape before any token", () =>
    Effect.gen(function* () {
      const openai = yield* ProviderServer.make(fastOptions())
      const res = yield* postAndRead(`${openai.baseUrl}/v1/chat/completions`, chat("hi [[sim:error]]"))
      assert.strictEqual(res.status, 500)
      assert.strictEqual(JSON.parse(res.text).error.type, "server_error")
      const counters = yield* openai.counters
      assert.strictEqual(counters.tokensProduced, 0)
      assert.strictEqual(counters.streamsStarted, 0)

      const claude = yield* ProviderServer.make(anthropicOptions)
      const res2 = yield* postAndRead(`${claude.baseUrl}/v1/messages`, anthropic("hi [[sim:error]]"))
      assert.strictEqual(res2.status, 500)
      assert.deepStrictEqual(JSON.parse(res2.text).type, "error")
      assert.strictEqual(JSON.parse(res2.text).error.type, "api_error")
    }).pipe(Effect.scoped)
  )

  it.live("a marker scoped to another provider leaves this one alone", () =>
    Effect.gen(function* () {
      const one = yield* ProviderServer.make(fastOptions({ providerId: "sim-a" }))
      const two = yield* ProviderServer.make(fastOptions({ providerId: "sim-b" }))
      const body = chat("hi [[sim:error@sim-a]]")
      assert.strictEqual((yield* postAndRead(`${one.baseUrl}/v1/chat/completions`, body)).status, 500)
      const ok = yield* postAndRead(`${two.baseUrl}/v1/chat/completions`, body)
      assert.strictEqual(ok.status, 200)
      assert.strictEqual(dataLines(ok.text).at(-1), "[DONE]")
    }).pipe(Effect.scoped)
  )

  it.live("default faults come from config and can be changed at run time", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer.make(fastOptions({ faults: { alwaysError: true } }))
      const url = `${server.baseUrl}/v1/chat/completions`
      assert.strictEqual((yield* postAndRead(url, chat("hi"))).status, 500)
      yield* server.setFaults({})
      assert.strictEqual((yield* postAndRead(url, chat("hi"))).status, 200)
    }).pipe(Effect.scoped)
  )

  it.live("[[sim:drop]] ends the stream after a few tokens with no usage and a broken connection", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer.make(fastOptions())
      const res = yield* postAndRead(`${server.baseUrl}/v1/chat/completions`, chat("hi [[sim:drop]]"))
      assert.strictEqual(res.status, 200)
      assert.isDefined(res.error)
      const lines = dataLines(res.text)
      assert.notInclude(lines, "[DONE]")
      const chunks = lines.map((l) => JSON.parse(l))
      assert.isTrue(chunks.every((c) => c.usage === null && c.choices[0].finish_reason === null))
      const tokens = chunks.filter((c) => c.choices[0].delta.content).length
      assert.strictEqual(tokens, ProviderServer.dropAfterTokens)
      assert.strictEqual((yield* server.counters).tokensProduced, ProviderServer.dropAfterTokens)

      const claude = yield* ProviderServer.make(anthropicOptions)
      const res2 = yield* postAndRead(`${claude.baseUrl}/v1/messages`, anthropic("hi [[sim:drop]]"))
      assert.isDefined(res2.error)
      const names = events(res2.text).map((e) => e.event)
      assert.notInclude(names, "message_delta")
      assert.notInclude(names, "message_stop")

      const plain = yield* postAndRead(`${server.baseUrl}/v1/chat/completions`, {
        ...chat("hi [[sim:drop]]"),
        stream: false
      })
      assert.isTrue(plain.error !== undefined || plain.text === "")
    }).pipe(Effect.scoped)
  )

  it.live("stops generating as soon as the client disconnects", () =>
    Effect.gen(function* () {
      const server = yield* ProviderServer.make(fastOptions({ tokensPerSecond: 50 }))
      const controller = new AbortController()
      const response = yield* postJson(
        `${server.baseUrl}/v1/chat/completions`,
        chat("a long answer please", { reasoning_effort: "high" }),
        controller.signal
      )
      const reader = response.body!.getReader()
      yield* Effect.promise(() => reader.read())
      yield* Effect.promise(() => reader.read())
      controller.abort()
      // The server learns of the disconnect when its socket closes: waited for, not read after a fixed
      // pause (on a loaded machine tokens were still being produced 150 ms after the abort).
      let atAbort = yield* server.counters
      for (let i = 0; i < 1_000 && atAbort.streamsAborted === 0; i++) {
        yield* Effect.sleep(10)
        atAbort = yield* server.counters
      }
      yield* Effect.sleep(300)
      const later = yield* server.counters
      assert.strictEqual(later.tokensProduced, atAbort.tokensProduced)
      assert.isAbove(later.tokensProduced, 0)
      assert.strictEqual(later.streamsAborted, 1)
      assert.strictEqual(later.streamsCompleted, 0)

      const fast = yield* ProviderServer.make(fastOptions())
      const whole = yield* postJson(`${fast.baseUrl}/v1/chat/completions`, {
        ...chat("a long answer please", { reasoning_effort: "high" }),
        stream: false
      }).pipe(Effect.flatMap(readJson<{ usage: { completion_tokens: number } }>))
      assert.isBelow(atAbort.tokensProduced, whole.usage.completion_tokens)
    }).pipe(Effect.scoped)
  )
})

describe("pacing", () => {
  it("sends the first token after ttft and then tokens at the configured rate", () => {
    const frames = [
      { text: "head", tokens: 0 },
      ...Array.from({ length: 10 }, (_, i) => ({ text: `t${i}`, tokens: 1 })),
      { text: "tail", tokens: 0 }
    ]
    const ticks = ProviderServer.pace(frames, { ttftMs: 100, tokensPerSecond: 50 })
    assert.strictEqual(ticks[0]!.delayMs, 100)
    assert.strictEqual(ticks[0]!.text, "headt0")
    assert.isTrue(ticks.slice(1, 10).every((t) => t.delayMs === 20 && t.tokens === 1))
    assert.strictEqual(ticks.map((t) => t.text).join(""), frames.map((f) => f.text).join(""))
    const fast = ProviderServer.pace(frames, { ttftMs: 5, tokensPerSecond: 1000 })
    assert.isTrue(fast.slice(1).every((t) => t.delayMs === 10 || t.delayMs === 0))
    assert.strictEqual(
      fast.reduce((n, t) => n + t.tokens, 0),
      10
    )
  })
})
