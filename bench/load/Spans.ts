import { median } from "../support/Stats.ts"

/**
 * The spans of an OTLP/HTTP JSON export, and where they fall in a call (`bench:phases`): for each span name, its
 * median start and end from its call's server span and its median length.
 */
export interface Span {
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId: string | undefined
  readonly startNs: bigint
  readonly endNs: bigint
}

/** A span as OTLP/HTTP JSON writes it (ids in hex, times in nanoseconds as strings; a root's parent empty). */
export interface OtlpSpan {
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly startTimeUnixNano: string
  readonly endTimeUnixNano: string
}

export interface OtlpJson {
  readonly resourceSpans?: ReadonlyArray<{
    readonly scopeSpans?: ReadonlyArray<{ readonly spans?: ReadonlyArray<OtlpSpan> }>
  }>
}

/** The spans of one OTLP/HTTP JSON export request. */
export const spansOf = (body: OtlpJson): ReadonlyArray<Span> =>
  (body.resourceSpans ?? []).flatMap((resource) =>
    (resource.scopeSpans ?? []).flatMap((scope) =>
      (scope.spans ?? []).map((span) => ({
        name: span.name,
        traceId: span.traceId,
        spanId: span.spanId,
        parentSpanId: span.parentSpanId === "" ? undefined : span.parentSpanId,
        startNs: BigInt(span.startTimeUnixNano),
        endNs: BigInt(span.endTimeUnixNano)
      }))
    )
  )

export interface Phase {
  /** The span's name, with its parent's: `postgres < Completions.admit`. */
  readonly name: string
  /** In how many of the calls it appears (at least once). */
  readonly calls: number
  readonly startMs: number
  readonly endMs: number
  readonly lengthMs: number
}

/**
 * For the calls (the traces whose root, a span with no parent at all, is named `root`, starts at `sinceNs`
 * or later, holds a `within` span (a paid call's admission) and no `without` span (another kind of call's)), each span name's median start and end from
 * the root's start, and its median length, in the order of their starts; the root's own end is among them.
 * A name that occurs twice in a call counts twice in its medians. The load client sends no trace context,
 * so the server span is the only root; an upstream call's span whose parent was dropped by the exporter
 * still names a parent, and its trace is not a call.
 */
export const phasesOf = (
  spans: ReadonlyArray<Span>,
  options: {
    readonly root?: string
    readonly within?: string
    readonly sinceNs?: bigint
    readonly without?: string
  } = {}
) => {
  const { root = "POST", within = "Completions.admit", sinceNs = 0n, without } = options
  const traces = new Map<string, Array<Span>>()
  for (const span of spans) {
    const trace = traces.get(span.traceId)
    if (trace === undefined) traces.set(span.traceId, [span])
    else trace.push(span)
  }
  const byName = new Map<
    string,
    { calls: number; starts: Array<number>; ends: Array<number>; lengths: Array<number> }
  >()
  let calls = 0
  for (const trace of traces.values()) {
    const ids = new Map(trace.map((span) => [span.spanId, span]))
    const top = trace.find((span) => span.name === root && span.parentSpanId === undefined)
    if (top === undefined || top.startNs < sinceNs || !trace.some((span) => span.name === within)) continue
    if (without !== undefined && trace.some((span) => span.name === without)) continue
    calls++
    const seen = new Set<string>()
    for (const span of trace) {
      const parent = span.parentSpanId === undefined ? undefined : ids.get(span.parentSpanId)
      const name = parent === undefined ? span.name : `${span.name} < ${parent.name}`
      const entry = byName.get(name) ?? { calls: 0, starts: [], ends: [], lengths: [] }
      if (!seen.has(name)) entry.calls++
      seen.add(name)
      entry.starts.push(Number(span.startNs - top.startNs) / 1e6)
      entry.ends.push(Number(span.endNs - top.startNs) / 1e6)
      entry.lengths.push(Number(span.endNs - span.startNs) / 1e6)
      byName.set(name, entry)
    }
  }
  const phases: Array<Phase> = [...byName].map(([name, entry]) => ({
    name,
    calls: entry.calls,
    startMs: median(entry.starts),
    endMs: median(entry.ends),
    lengthMs: median(entry.lengths)
  }))
  return { calls, phases: phases.sort((a, b) => a.startMs - b.startMs || a.endMs - b.endMs) }
}
