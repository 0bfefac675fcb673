import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Scope, Tracer } from "effect"
import { inServices, LiveStreams } from "../../src/inference/LiveStreams.ts"

/** A service only the caller's context has, as a request's context has its HTTP request. */
class CallerOnly extends Context.Service<CallerOnly, { readonly id: string }>()("test/CallerOnly") {}

interface Seen {
  readonly callerOnly: boolean
  readonly parentSpanId: string | undefined
}

const look = (seen: Deferred.Deferred<Seen>) =>
  Effect.withFiber((fiber) =>
    Deferred.succeed(seen, {
      callerOnly: Context.getOrUndefined(fiber.context, CallerOnly) !== undefined,
      parentSpanId: Context.getOrUndefined(fiber.context, Tracer.ParentSpan)?.spanId
    })
  )

// D460: what outlives a request's step (the serving fiber, the releases registered in the request's
// scope) must not keep the request's context, which Effect flattens into a copy of the whole service
// map: it runs in the router's shared services, under the caller's span.
describe("what outlives a request runs in the shared services", () => {
  it.effect("a stream's work: not the caller's context, the caller's span as its parent", () =>
    Effect.gen(function* () {
      const live = yield* LiveStreams
      const seen = yield* Deferred.make<Seen>()
      const callerSpanId = yield* Effect.gen(function* () {
        const span = yield* Effect.currentSpan
        yield* live.start<never>("req_context", () => look(seen))
        return span.spanId
      }).pipe(Effect.withSpan("caller"), Effect.provideService(CallerOnly, { id: "request" }))
      const inWork = yield* Deferred.await(seen)
      assert.isFalse(inWork.callerOnly)
      assert.strictEqual(inWork.parentSpanId, callerSpanId)
    }).pipe(Effect.provide(LiveStreams.layer))
  )

  it.effect("a release registered under inServices runs without the caller's context", () =>
    Effect.gen(function* () {
      const services = yield* Effect.context<never>()
      const scope = yield* Scope.make()
      const seen = yield* Deferred.make<Seen>()
      const registered = yield* Effect.gen(function* () {
        const inCaller = yield* CallerOnly
        yield* Effect.acquireRelease(Effect.void, () => look(seen)).pipe(
          Scope.provide(scope),
          inServices(services)
        )
        return inCaller.id
      }).pipe(Effect.provideService(CallerOnly, { id: "request" }))
      assert.strictEqual(registered, "request")
      yield* Scope.close(scope, Exit.void)
      assert.isFalse((yield* Deferred.await(seen)).callerOnly)
    })
  )
})
