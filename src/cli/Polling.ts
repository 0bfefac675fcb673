import { Clock, Data, Duration, Effect } from "effect"
import type { DeviceFlowError } from "../domain/Setup.ts"
import { SLOW_DOWN_STEP_S } from "../setup/DeviceFlow.ts"

/** Why the setup command stops without a key; `message` is what it prints. */
export class SetupFailed extends Data.TaggedError("SetupFailed")<{ readonly message: string }> {}

/** A failure to reach the router at all (the request may be retried). */
export class Unreachable extends Data.TaggedError("Unreachable")<{ readonly message: string }> {}

/** Longest wait between polls after connection failures (RFC 8628 section 3.5: back off exponentially). */
const MAX_BACKOFF_S = 60

export interface PollState {
  readonly polls: number
  readonly intervalSeconds: number
  /** Milliseconds until the setup expires. */
  readonly remainingMs: number
}

/**
 * Polls the token endpoint as RFC 8628 section 3.5 asks: never sooner than `interval` seconds after the
 * previous poll, 5 seconds more for good after each `slow_down`, doubling the wait after a connection
 * failure, until the key comes, the wallet holder denies it, or the setup expires.
 */
export const waitForKey = <A>(options: {
  readonly intervalSeconds: number
  readonly expiresInSeconds: number
  readonly exchange: Effect.Effect<A, DeviceFlowError | Unreachable>
  readonly onPoll?: (state: PollState) => Effect.Effect<void>
}) =>
  Effect.gen(function* () {
    const deadline = (yield* Clock.currentTimeMillis) + options.expiresInSeconds * 1000
    let interval = options.intervalSeconds
    let wait = interval
    for (let polls = 1; ; polls++) {
      yield* Effect.sleep(Duration.seconds(wait))
      const now = yield* Clock.currentTimeMillis
      if (now >= deadline) {
        return yield* new SetupFailed({
          message: "The setup expired before it was approved; run the command again"
        })
      }
      const outcome = yield* Effect.result(options.exchange)
      yield* options.onPoll?.({ polls, intervalSeconds: interval, remainingMs: deadline - now }) ??
        Effect.void
      if (outcome._tag === "Success") return outcome.success
      const failure = outcome.failure
      if (failure._tag === "Unreachable") {
        wait = Math.min(MAX_BACKOFF_S, wait * 2)
        continue
      }
      switch (failure.error) {
        case "authorization_pending":
          wait = interval
          continue
        case "slow_down":
          interval += SLOW_DOWN_STEP_S
          wait = interval
          continue
        case "access_denied":
          return yield* new SetupFailed({ message: "The wallet holder denied this setup; no key was issued" })
        case "expired_token":
          return yield* new SetupFailed({
            message: "The setup expired before it was approved; run the command again"
          })
        default:
          return yield* new SetupFailed({
            message: `The router refused the exchange: ${failure.error_description}`
          })
      }
    }
  })
