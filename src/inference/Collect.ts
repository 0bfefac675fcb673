import { Effect, Stream } from "effect"
import type { LiveStreams } from "./LiveStreams.ts"
import type { Admitted, ServeSummary } from "./Paid.ts"

/** A paid call the router made for itself (a task's rubric review, an evaluation case), read to its end. */
export interface Collected {
  readonly requestId: string
  readonly text: string
  /** Tool calls by index: name and the arguments as streamed. */
  readonly toolCalls: ReadonlyArray<{ readonly name: string; readonly arguments: string }>
  readonly summary: ServeSummary | undefined
}

/** Reads an admitted request's events until its `End` (the router's own callers have no dialect to encode). */
export const collect = (live: LiveStreams["Service"], admitted: Admitted) =>
  Effect.gen(function* () {
    let text = ""
    const toolCalls: Array<{ name: string; arguments: string }> = []
    let summary: ServeSummary | undefined
    // The router's own calls register no keeper, so their events are never compacted away.
    yield* live.follow(admitted.stream, 0).pipe(
      Stream.orDie,
      Stream.runForEach(({ event }) =>
        Effect.sync(() => {
          if (event._tag === "End") {
            summary = event.summary
            return
          }
          const delta = event.event
          if (delta._tag === "TextDelta") text += delta.text
          if (delta._tag === "ToolCallDelta") {
            const call = toolCalls[delta.index] ?? { name: "", arguments: "" }
            toolCalls[delta.index] = call
            if (delta.name !== undefined) call.name = delta.name
            call.arguments += delta.argumentsDelta
          }
        })
      )
    )
    return {
      requestId: admitted.requestId,
      text,
      toolCalls: toolCalls.filter(Boolean),
      summary
    } satisfies Collected
  })
