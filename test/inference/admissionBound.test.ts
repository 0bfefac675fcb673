import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { AdmissionBound } from "../../src/inference/AdmissionBound.ts"
import { fundedKey, keyState } from "../support/Keys.ts"
import { providerRequests, waitFor, waitForBook } from "../support/Pay.ts"
import { call, RouterUrl, routerWithFleet } from "../support/Router.ts"

/** A permit held in a scope of its own until that scope is closed. */
const hold = (bound: AdmissionBound["Service"]) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* bound.enter.pipe(Scope.provide(scope))
    return scope
  })

/** Takes a permit, writes `name` down in `order` as admitted, and lets the permit go. */
const admitInto = (bound: AdmissionBound["Service"], order: Array<string>, name: string) =>
  Effect.scoped(
    Effect.andThen(
      bound.enter,
      Effect.sync(() => order.push(name))
    )
  )

/** The error code a refused wait failed with. */
const busyCode = (exit: Exit.Exit<unknown, { readonly code: string }>) => {
  if (Exit.isSuccess(exit)) return "admitted"
  const failure = exit.cause.reasons.find((r) => r._tag === "Fail")
  return failure?._tag === "Fail" ? failure.error.code : "no failure"
}

describe("the admission bound (D531)", () => {
  it.effect("admits up to its bound at once, queues the rest in arrival order, refuses past the wait", () =>
    Effect.gen(function* () {
      const bound = yield* AdmissionBound.make({ concurrency: 2, waitSeconds: 10 })
      const first = yield* hold(bound)
      const second = yield* hold(bound)
      const order: Array<string> = []
      const waiter = (name: string) => admitInto(bound, order, name).pipe(Effect.exit)
      const a = yield* Effect.forkChild(waiter("a"))
      yield* TestClock.adjust("1 second")
      const b = yield* Effect.forkChild(waiter("b"))
      yield* TestClock.adjust("1 second")
      assert.deepStrictEqual(order, [], "both wait while two permits are held")
      yield* Scope.close(first, Exit.void)
      assert.isTrue(Exit.isSuccess(yield* Fiber.join(a)))
      assert.isTrue(Exit.isSuccess(yield* Fiber.join(b)))
      assert.deepStrictEqual(order, ["a", "b"], "served in arrival order")

      // One permit still held, one free: a third holder takes it; the next waits out its bound.
      const third = yield* hold(bound)
      const late = yield* Effect.forkChild(Effect.scoped(bound.enter).pipe(Effect.exit))
      yield* TestClock.adjust("9 seconds")
      assert.isUndefined(late.pollUnsafe(), "still waiting before its bound")
      yield* TestClock.adjust("1 second")
      assert.strictEqual(busyCode(yield* Fiber.join(late)), "router_busy")
      yield* Scope.close(second, Exit.void)
      yield* Scope.close(third, Exit.void)
    })
  )

  it.effect("a newcomer does not take a permit released to a waiter that has not woken yet", () =>
    Effect.gen(function* () {
      const bound = yield* AdmissionBound.make({ concurrency: 1, waitSeconds: 10 })
      const held = yield* hold(bound)
      const order: Array<string> = []
      const waiter = (name: string) => admitInto(bound, order, name)
      const first = yield* Effect.forkChild(waiter("first"))
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* bound.waiting, 1)
      // The release and a newcomer in the same fiber's run, before the woken waiter runs again.
      yield* Scope.close(held, Exit.void)
      yield* waiter("newcomer")
      yield* Fiber.join(first)
      assert.deepStrictEqual(order, ["first", "newcomer"])
      assert.strictEqual(yield* bound.waiting, 0)
    })
  )

  it.effect(
    "a permit taken at once comes back however its scope closes: success, failure, interruption",
    () =>
      Effect.gen(function* () {
        const bound = yield* AdmissionBound.make({ concurrency: 1, waitSeconds: 5 })
        for (const exit of [Exit.void, Exit.fail("refused"), Exit.interrupt()]) {
          const held = yield* hold(bound)
          const next = yield* Effect.forkChild(Effect.scoped(bound.enter).pipe(Effect.exit))
          yield* TestClock.adjust("1 second")
          assert.strictEqual(yield* bound.waiting, 1, "the one permit is held")
          yield* Scope.close(held, exit)
          assert.isTrue(Exit.isSuccess(yield* Fiber.join(next)), "the released permit admits the waiter")
        }
        // Every permit back: one taken at once, with nobody waiting.
        const last = yield* hold(bound)
        assert.strictEqual(yield* bound.waiting, 0)
        yield* Scope.close(last, Exit.void)
      })
  )

  it.effect("a waiter that is interrupted or refused takes nothing: every permit comes back", () =>
    Effect.gen(function* () {
      const bound = yield* AdmissionBound.make({ concurrency: 1, waitSeconds: 5 })
      const held = yield* hold(bound)
      const gone = yield* Effect.forkChild(Effect.scoped(bound.enter))
      const timedOut = yield* Effect.forkChild(Effect.scoped(bound.enter).pipe(Effect.exit))
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* bound.waiting, 2)
      yield* Fiber.interrupt(gone)
      assert.strictEqual(yield* bound.waiting, 1, "the interrupted waiter left the queue")
      yield* TestClock.adjust("5 seconds")
      const refused = yield* Fiber.join(timedOut)
      assert.strictEqual(busyCode(refused), "router_busy")
      assert.strictEqual(yield* bound.waiting, 0)
      // A waiter now, queued behind the held permit: had the interrupted or refused waiter kept its place in
      // the queue, the released permit would go to it and this one would wait out its bound.
      const next = yield* Effect.forkChild(Effect.scoped(bound.enter).pipe(Effect.exit))
      yield* TestClock.adjust("1 second")
      assert.strictEqual(yield* bound.waiting, 1)
      yield* Scope.close(held, Exit.void)
      assert.isTrue(Exit.isSuccess(yield* Fiber.join(next)))
      assert.strictEqual(yield* bound.waiting, 0)
    })
  )
})

/** A key-paid call in the dialect of `path`, read whole. */
const paid = (secret: string, path: string, body: unknown, signal?: AbortSignal) =>
  Effect.gen(function* () {
    const base = yield* RouterUrl
    return yield* Effect.promise(async () => {
      try {
        const response = await fetch(`${base}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-credit-key": secret },
          body: JSON.stringify(body),
          ...(signal === undefined ? {} : { signal })
        })
        const text = await response.text()
        return { status: response.status, text, retryAfter: response.headers.get("retry-after") }
      } catch {
        return { status: 0, text: "", retryAfter: null }
      }
    })
  })

const chat = { model: "chat-small", messages: [{ role: "user", content: "hello" }], max_tokens: 16 }
const messages = { model: "chat-small", messages: [{ role: "user", content: "hello" }], max_tokens: 16 }

const reservedRows = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM requests WHERE status = 'reserved'`
  const leases = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM capacity_leases`
  return { reserved: rows[0]!.n, leases: leases[0]!.n }
}).pipe(Effect.orDie)

describe("the admission bound in the router (D531)", () => {
  layer(routerWithFleet({ admission: { concurrency: 1, waitSeconds: 2 } }), {
    excludeTestServices: true,
    timeout: 180_000
  })((it) => {
    it.effect(
      "paid calls past the bound wait and are refused 503 router_busy in their dialect, nothing charged; the rest of the router answers meanwhile",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const key = yield* fundedKey({ budget: 10_000_000, balance: 10_000_000 })
          const bound = yield* AdmissionBound
          const before = yield* keyState(key.keyId)
          const providerCalls = yield* providerRequests

          // The one permit is held: every paid call waits for it.
          const held = yield* hold(bound)
          const started = Date.now()
          const [openai, anthropic, image] = yield* Effect.all(
            [
              paid(key.secret, "/v1/chat/completions", chat),
              paid(key.secret, "/v1/messages", messages),
              paid(key.secret, "/v1/images/generations", { model: "image-standard", prompt: "a lighthouse" })
            ],
            { concurrency: 3 }
          )
          const waited = Date.now() - started
          assert.isAtLeast(waited, 1_900, "refused only after waiting the bound")
          assert.strictEqual(openai.status, 503)
          assert.strictEqual(
            (JSON.parse(openai.text) as { error: { code: string } }).error.code,
            "router_busy"
          )
          assert.isNotNull(openai.retryAfter)
          assert.strictEqual(anthropic.status, 503)
          const anthropicError = JSON.parse(anthropic.text) as { type: string; error: { type: string } }
          assert.strictEqual(anthropicError.type, "error")
          assert.strictEqual(anthropicError.error.type, "overloaded_error")

          assert.strictEqual(image.status, 503)
          assert.strictEqual(
            (JSON.parse(image.text) as { error: { code: string } }).error.code,
            "router_busy"
          )

          // A caller who hangs up while waiting leaves the queue having taken nothing. Meanwhile the rest of
          // the router is not queued behind paid work: the book answers while the call waits.
          const abort = new AbortController()
          const cut = yield* Effect.forkChild(paid(key.secret, "/v1/chat/completions", chat, abort.signal))
          yield* waitFor(
            "the call to queue",
            Effect.map(bound.waiting, (n) => (n === 1 ? true : undefined))
          )
          assert.strictEqual((yield* call("/v1/market/book")).status, 200)
          assert.strictEqual(yield* bound.waiting, 1, "the paid call still waits")
          abort.abort()
          assert.strictEqual((yield* Fiber.join(cut)).status, 0)
          yield* waitFor(
            "the router to see the hang-up",
            Effect.map(bound.waiting, (n) => (n === 0 ? true : undefined))
          )

          const after = yield* keyState(key.keyId)
          assert.deepStrictEqual(after, before, "nothing reserved or spent on the key")
          assert.deepStrictEqual(yield* reservedRows, { reserved: 0, leases: 0 })
          assert.strictEqual(yield* providerRequests, providerCalls, "no provider was called")

          // A waiter whose turn comes within the bound is served.
          const queued = yield* Effect.forkChild(paid(key.secret, "/v1/chat/completions", chat))
          yield* Effect.sleep("500 millis")
          yield* Scope.close(held, Exit.void)
          const served = yield* Fiber.join(queued)
          assert.strictEqual(served.status, 200, served.text)

          // And the permit is back once that call is admitted: the next takes it at once.
          const next = yield* paid(key.secret, "/v1/chat/completions", chat)
          assert.strictEqual(next.status, 200, next.text)
          yield* waitFor(
            "both calls settled",
            Effect.map(reservedRows, (rows) => (rows.reserved === 0 && rows.leases === 0 ? true : undefined))
          )
        })
    )
  })
})
