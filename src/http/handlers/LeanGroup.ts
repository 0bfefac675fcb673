import { Context, Effect, Layer, Scope } from "effect"

/**
 * A handler group built with no services of its own in reach (D537), for the paid surfaces a held stream
 * lives on.
 *
 * `HttpApiBuilder.group` keeps the context its layer is built in and provides it to every request of the
 * group (`Effect.provideContext`): unless that kept context is empty, a merge that copies the request
 * fiber's whole service map (80-odd entries; about 5.7 KB allocated a call) on every request. Here `make`
 * takes what the handlers use when the group is built and returns the group's layer; that layer is built
 * in an empty context (its scope is handed to it), so the group keeps an empty context and a request runs
 * in its server fiber's own. (The merge still flattens that context once, to read its size: library code.)
 * The compiler holds the handlers to it: `make` must yield a layer that requires nothing, so a handler
 * that reached for a service per request would not type-check.
 * A group with `HttpApiMiddleware` must not use this: the builder looks middleware up in the kept context.
 */
export const leanGroup = <A, E, E2, R>(
  make: Effect.Effect<Layer.Layer<A, E>, E2, R>
): Layer.Layer<A, E | E2, Exclude<R, Scope.Scope>> =>
  // Memoized like any layer (one build however often it is provided), and `make` runs in the layer's scope:
  // what it acquires is released with the group.
  Layer.fromBuildMemo((_, scope) =>
    Effect.flatMap(Scope.provide(make, scope), (group) =>
      Effect.updateContext(buildAlone(group, scope), (_: Context.Context<never>) => Context.empty())
    )
  )

/**
 * The layer's own build (`Layer.build` would add the memo map to the context the group keeps: a one-entry
 * context, and the merge copies the whole map again). Every layer has it (`Layer`'s prototype); the type
 * leaves it out.
 */
const buildAlone = <A, E>(
  layer: Layer.Layer<A, E>,
  scope: Scope.Scope
): Effect.Effect<Context.Context<A>, E> =>
  (layer as unknown as BuildsAlone<A, E>).build(Layer.makeMemoMapUnsafe(), scope)

interface BuildsAlone<A, E> {
  readonly build: (memoMap: Layer.MemoMap, scope: Scope.Scope) => Effect.Effect<Context.Context<A>, E>
}
