import { Effect, Stream } from "effect"
import type { KeptReply, LiveStreams } from "./LiveStreams.ts"
import type { Admitted, ServeSummary } from "./Paid.ts"

/**
 * What the router's own call keeps once it has been read: nothing to replay (its token goes to no one), only
 * its place in the registry, counted in the replay budget with its record, as a finished reply is (D558).
 */
const NOTHING_KEPT: KeptReply = {
  contentType: "application/json",
  headers: {},
  body: new Uint8Array(0),
  offsets: undefined
}
const keepNothing = () => NOTHING_KEPT

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
    // Read from the first event, with no keeper yet (a keeper would compact the events away under the
    // reader); once the reading ends, read through or interrupted, the events go when the work finishes
    // (at once if it has), and the stream counts in the replay budget like any finished reply (D558).
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
      ),
      Effect.ensuring(Effect.sync(() => live.keep(admitted.stream, keepNothing)))
    )
    return {
      requestId: admitted.requestId,
      text,
      toolCalls: toolCalls.filter(Boolean),
      summary
    } satisfies Collected
  })
