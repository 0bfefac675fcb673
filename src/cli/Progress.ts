import { Clock, Effect, Ref } from "effect"
import { formatRemaining } from "./Format.ts"
import type { PollState } from "./Polling.ts"

const FRAMES = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"]

/**
 * A progress indicator on stderr while the command waits for the approval. On a terminal a spinner line
 * counts down the setup's remaining time; elsewhere (a log, a test) one line at the start and one whenever
 * the router asks the command to slow down. Returns the `onPoll` hook for `waitForKey`.
 */
export const withProgress = <A, E, R>(
  options: { readonly userCode: string; readonly intervalSeconds: number; readonly expiresInSeconds: number },
  run: (onPoll: (state: PollState) => Effect.Effect<void>) => Effect.Effect<A, E, R>
) =>
  Effect.gen(function* () {
    const tty = process.stderr.isTTY === true
    const write = (text: string) => Effect.sync(() => process.stderr.write(text))
    const startedAt = yield* Clock.currentTimeMillis
    const state = yield* Ref.make({ intervalSeconds: options.intervalSeconds, polls: 0 })
    const onPoll = (poll: PollState) =>
      Effect.gen(function* () {
        const before = yield* Ref.getAndSet(state, {
          intervalSeconds: poll.intervalSeconds,
          polls: poll.polls
        })
        if (!tty && poll.intervalSeconds !== before.intervalSeconds) {
          yield* write(`The router asked to poll less often: every ${poll.intervalSeconds} s now.\n`)
        }
      })
    if (!tty) {
      yield* write(
        `Waiting for approval of ${options.userCode} (polling every ${options.intervalSeconds} s, ` +
          `the setup expires in ${formatRemaining(options.expiresInSeconds * 1000)})…\n`
      )
      return yield* run(onPoll)
    }
    const spinner = Effect.gen(function* () {
      for (let frame = 0; ; frame++) {
        const { intervalSeconds, polls } = yield* Ref.get(state)
        const left = options.expiresInSeconds * 1000 - ((yield* Clock.currentTimeMillis) - startedAt)
        yield* write(
          `\r\u001b[2K${FRAMES[frame % FRAMES.length]} Waiting for approval of ${options.userCode}: ` +
            `${formatRemaining(left)} left, ${polls} polls, every ${intervalSeconds} s`
        )
        yield* Effect.sleep("125 millis")
      }
    })
    // The spinner stops with the scope, then its line is cleared, however the wait ends.
    return yield* Effect.scoped(Effect.andThen(Effect.forkScoped(spinner), run(onPoll))).pipe(
      Effect.ensuring(write("\r\u001b[2K"))
    )
  })
