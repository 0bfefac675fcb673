import { Effect } from "effect"
import type { ChatCompletionRequest } from "../domain/Chat.ts"
import { CapabilityUnsupported, type FeatureGated, gated } from "../domain/Errors.ts"

/**
 * The gate step: launch-gated fields and capabilities the router will not serve are refused before
 * any pricing, payment or provider work.
 */

/** Context Passports and speculative routing are gated off at launch (spec 1), on every paid surface. */
export const gateLaunchFeatures = (request: {
  readonly context?: unknown
  readonly routing?: { readonly speculative?: unknown } | undefined
}): Effect.Effect<void, FeatureGated> => {
  if (request.context !== undefined) return Effect.fail(gated("context_passports"))
  if (request.routing?.speculative !== undefined) return Effect.fail(gated("speculative_routing"))
  return Effect.void
}

/** Vendor-native hosted tools the router will not run (computer use, hosted browsing, ...). */
const isHostedTool = (tool: { readonly type: string }) => tool.type !== "function"

export const gateChat = Effect.fnUntraced(function* (request: ChatCompletionRequest) {
  yield* gateLaunchFeatures(request)
  const hosted = request.tools?.find(isHostedTool)
  if (hosted !== undefined) {
    return yield* new CapabilityUnsupported({
      code: "unsupported_capability",
      param: "tools",
      message: `Hosted tool "${hosted.type}" is not available through this router; use local function tools`
    })
  }
})
