import { Schema } from "effect"
import type { UpstreamEvent, UpstreamSource } from "../Events.ts"

/** What one dialect's parser makes of one SSE frame. */
export interface StreamStep<S> {
  readonly state: S
  readonly events: ReadonlyArray<UpstreamEvent>
  /** The dialect's terminal frame was read; nothing after it is read. */
  readonly done: boolean
}

export const Source = Schema.Struct({
  id: Schema.String,
  title: Schema.String,
  url: Schema.String,
  snippet: Schema.String
})

const decodeSource = Schema.decodeUnknownOption(Source)

/** Grounding sources preserved as sent; entries without the four string fields are skipped. */
export const sourcesToEvents = (sources: ReadonlyArray<unknown> | null | undefined): Array<UpstreamEvent> => {
  const valid: Array<UpstreamSource> = []
  for (const source of sources ?? []) {
    const decoded = decodeSource(source)
    if (decoded._tag === "Some") valid.push(decoded.value)
  }
  return valid.length > 0 ? [{ _tag: "Sources", sources: valid }] : []
}
