import type { UpstreamSource } from "../Events.ts"
import { richEnvelope } from "../Rich.ts"

export { isSafeExternalUrl } from "../Rich.ts"

/**
 * The Responses API's `output_text.annotations`, projected from `svc.rich` (one rule set:
 * `src/inference/Rich.ts`): each citation range becomes one `url_citation` per cited source.
 */
export interface UrlCitation {
  readonly type: "url_citation"
  /** Code-point offsets of the `[n]` marker in the text. */
  readonly start_index: number
  readonly end_index: number
  readonly url: string
  readonly title: string
}

export const citationAnnotations = (
  text: string,
  sources: ReadonlyArray<UpstreamSource>
): ReadonlyArray<UrlCitation> => {
  const rich = richEnvelope(text, { sources })
  if (rich === undefined) return []
  const byId = new Map(rich.sources.map((s) => [s.id, s]))
  return rich.annotations.flatMap((annotation) =>
    annotation.source_ids.flatMap((id) => {
      const source = byId.get(id)
      return source === undefined
        ? []
        : [
            {
              type: "url_citation" as const,
              start_index: annotation.start_index,
              end_index: annotation.end_index,
              url: source.url,
              title: source.title
            }
          ]
    })
  )
}
